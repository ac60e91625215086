"""Query-string guards shared by the admin's listings.

Filter and search values come straight from the URL. PostgreSQL text cannot hold a NUL
character, so a value holding one would fail its query (a 500) while matching nothing
anyway: such parameters are dropped, with a message saying so.
"""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest, HttpResponseRedirect
from django.utils.translation import gettext as _

__all__ = ["drop_unstorable_parameters"]


def drop_unstorable_parameters(request: HttpRequest) -> HttpResponseRedirect | None:
    """Return a redirect to the same listing without parameters holding NUL, or None."""
    dropped = sorted(
        name
        for name, values in request.GET.lists()
        if "\x00" in name or any("\x00" in value for value in values)
    )
    if not dropped:
        return None
    kept = request.GET.copy()
    for name in dropped:
        del kept[name]
    messages.warning(
        request,
        _("Ignored %(names)s: it contains a NUL character, which no stored value can hold.")
        % {"names": ", ".join(repr(name.replace("\x00", "\\x00")) for name in dropped)},
    )
    query = kept.urlencode()
    return HttpResponseRedirect(f"{request.path}?{query}" if query else request.path)
