"""Sphinx directives that render reference tables from the code, so the docs cannot drift.

``.. pgqueue-settings::`` lists every ``PGQUEUE_*`` setting (name, default, meaning) from
``django_pgqueue.conf.SETTINGS``; ``.. pgqueue-checks::`` lists every system check ID;
``.. pgqueue-transitions::`` lists the state machine's moves from ``states.TRANSITIONS``.
"""

from __future__ import annotations

from typing import Any

from docutils import nodes
from docutils.parsers.rst import Directive


def _table(headers: list[str], rows: list[list[str]], widths: list[int]) -> nodes.table:
    table = nodes.table()
    group = nodes.tgroup(cols=len(headers))
    table += group
    for width in widths:
        group += nodes.colspec(colwidth=width)
    head = nodes.thead()
    group += head
    head += _row(headers)
    body = nodes.tbody()
    group += body
    for row in rows:
        body += _row(row)
    return table


def _row(cells: list[str]) -> nodes.row:
    row = nodes.row()
    for text in cells:
        entry = nodes.entry()
        paragraph = nodes.paragraph()
        if text.startswith("``") and text.endswith("``"):
            paragraph += nodes.literal(text=text[2:-2])
        else:
            paragraph += nodes.Text(text)
        entry += paragraph
        row += entry
    return row


def _default(value: object) -> str:
    if value is None:
        return "``None``"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int) and value >= 10_000:
        return f"``{value:_}``"
    return f"``{value!r}``"


class SettingsDirective(Directive):
    """Render the settings table."""

    def run(self) -> list[Any]:
        from django_pgqueue.checks import SETTING_CHECK_IDS
        from django_pgqueue.conf import SETTINGS

        rows = [
            [
                f"``PGQUEUE_{spec.name}``",
                _default(spec.default),
                spec.help,
                f"``{SETTING_CHECK_IDS[spec.name]}``",
            ]
            for spec in SETTINGS
        ]
        return [_table(["Setting", "Default", "Meaning", "Check"], rows, [30, 14, 46, 10])]


class ChecksDirective(Directive):
    """Render the table of system check IDs."""

    def run(self) -> list[Any]:
        from django_pgqueue.checks import CHECK_IDS, SETTING_CHECK_IDS

        rows = [[f"``{check_id}``", text] for check_id, text in CHECK_IDS.items()]
        rows += [
            [f"``{check_id}``", f"PGQUEUE_{name} is invalid (wrong type or out of range)."]
            for name, check_id in SETTING_CHECK_IDS.items()
        ]
        return [_table(["ID", "Reported when"], rows, [25, 75])]


class TransitionsDirective(Directive):
    """Render the state machine's transitions."""

    def run(self) -> list[Any]:
        from django_pgqueue.states import TRANSITIONS

        rows = [
            [
                f"``{transition.value}``",
                ", ".join(sorted(f"{source.value}" for source in sources)),
                target.value,
                str(transition.label),
            ]
            for transition, (sources, target) in TRANSITIONS.items()
        ]
        return [_table(["Move", "From", "To", "Meaning"], rows, [16, 26, 14, 44])]


class CommandDirective(Directive):
    """Render a management command's options from its own argument parser."""

    required_arguments = 1

    def run(self) -> list[Any]:
        from django.core.management import load_command_class

        command = load_command_class("django_pgqueue", self.arguments[0])
        parser = command.create_parser("manage.py", self.arguments[0])
        rows = []
        for action in parser._actions:
            if not action.option_strings or action.dest in _DJANGO_COMMON_OPTIONS:
                continue
            flags = ", ".join(action.option_strings)
            if action.metavar or (action.nargs != 0 and action.type is not None):
                flags += f" {action.metavar or action.dest.upper()}"
            rows.append([f"``{flags}``", (action.help or "").replace("%%", "%")])
        return [_table(["Option", "Meaning"], rows, [30, 70])]


_DJANGO_COMMON_OPTIONS = {
    "help",
    "version",
    "settings",
    "pythonpath",
    "traceback",
    "no_color",
    "force_color",
    "skip_checks",
    "verbosity",
}


class ModelDirective(Directive):
    """Render a model's columns (name, type, meaning) from its ``_meta``."""

    required_arguments = 1

    def run(self) -> list[Any]:
        from django.apps import apps

        model = apps.get_model("django_pgqueue", self.arguments[0])
        rows = []
        for field in model._meta.concrete_fields:
            meaning = str(field.verbose_name)
            if field.db_comment:
                meaning = f"{meaning}. {field.db_comment}"
            if field.null:
                meaning += " (may be NULL)"
            rows.append([f"``{field.column}``", field.get_internal_type(), meaning])
        return [_table(["Column", "Type", "Meaning"], rows, [22, 20, 58])]


# Where each status sits in the state diagram (x, y of the box centre).
_POSITIONS = {
    "pending": (140, 170),
    "processing": (420, 170),
    "succeeded": (690, 60),
    "dead_letter": (690, 285),
    "cancelled": (140, 320),
    "blocked": (420, 345),
}
# Curvature of the arrow between two statuses (0 = straight); keeps opposite arrows apart.
_BENDS = {
    ("pending", "processing"): -40,
    ("processing", "pending"): -40,
    ("dead_letter", "pending"): -170,
    ("cancelled", "pending"): -30,
    ("pending", "cancelled"): -30,
    ("blocked", "cancelled"): -25,
    ("cancelled", "blocked"): -25,
}


class StateDiagramDirective(Directive):
    """Render the state machine as an inline SVG, drawn from ``states.TRANSITIONS``."""

    def run(self) -> list[Any]:
        from django_pgqueue.states import TRANSITIONS

        edges: dict[tuple[str, str], list[str]] = {}
        for transition, (sources, target) in TRANSITIONS.items():
            for source in sources:
                edges.setdefault((source.value, target.value), []).append(transition.value)
        parts = [
            '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 820 400" role="img" '
            'aria-label="Job state machine" style="max-width:100%;font-family:sans-serif;'
            'font-size:12px">',
            '<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" '
            'markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" '
            'fill="#555"/></marker></defs>',
        ]
        for (source, target), names in sorted(edges.items()):
            parts.append(_edge(source, target, " / ".join(names)))
        for status, (x, y) in _POSITIONS.items():
            terminal = status in {"succeeded", "dead_letter", "cancelled"}
            fill = "#eef3fb" if not terminal else "#f4f4f4"
            parts.append(
                f'<rect x="{x - 62}" y="{y - 18}" width="124" height="36" rx="8" fill="{fill}" '
                f'stroke="#345" stroke-width="{2 if not terminal else 1}"/>'
                f'<text x="{x}" y="{y + 4}" text-anchor="middle" font-weight="bold">{status}</text>'
            )
        parts.append("</svg>")
        return [nodes.raw("", "".join(parts), format="html")]


def _edge(source: str, target: str, label: str) -> str:
    (x1, y1), (x2, y2) = _POSITIONS[source], _POSITIONS[target]
    if source == target:  # a loop above the box
        return (
            f'<path d="M{x1 - 30},{y1 - 18} C{x1 - 60},{y1 - 80} {x1 + 60},{y1 - 80} '
            f'{x1 + 30},{y1 - 18}" fill="none" stroke="#555" marker-end="url(#arrow)"/>'
            f'<text x="{x1}" y="{y1 - 68}" text-anchor="middle">{label}</text>'
        )
    # Leave and enter the boxes at their edges, not their centres.
    dx, dy = x2 - x1, y2 - y1
    length = (dx * dx + dy * dy) ** 0.5
    shrink = 70 if abs(dx) > abs(dy) else 24
    sx, sy = x1 + dx / length * shrink, y1 + dy / length * shrink
    ex, ey = x2 - dx / length * shrink, y2 - dy / length * shrink
    bend = _BENDS.get((source, target), 0)
    cx, cy = (sx + ex) / 2 - dy / length * bend, (sy + ey) / 2 + dx / length * bend
    # The label sits just outside the curve's midpoint (a quadratic's t = 0.5), pushed
    # away from the straight line between the boxes (upwards for a straight edge).
    mx, my = (sx + 2 * cx + ex) / 4, (sy + 2 * cy + ey) / 4
    ox, oy = mx - (sx + ex) / 2, my - (sy + ey) / 2
    norm = (ox * ox + oy * oy) ** 0.5
    if norm < 1:
        ox, oy, norm = dy / length, -dx / length, 1.0
        if oy > 0:
            ox, oy = -ox, -oy
    lx, ly = mx + ox / norm * 16, my + oy / norm * 16 + 4
    return (
        f'<path d="M{sx:.0f},{sy:.0f} Q{cx:.0f},{cy:.0f} {ex:.0f},{ey:.0f}" fill="none" '
        f'stroke="#555" marker-end="url(#arrow)"/>'
        f'<text x="{lx:.0f}" y="{ly:.0f}" text-anchor="middle" fill="#234">{label}</text>'
    )


def setup(app: Any) -> dict[str, Any]:
    """Register the directives."""
    app.add_directive("pgqueue-state-diagram", StateDiagramDirective)
    app.add_directive("pgqueue-command", CommandDirective)
    app.add_directive("pgqueue-model", ModelDirective)
    app.add_directive("pgqueue-settings", SettingsDirective)
    app.add_directive("pgqueue-checks", ChecksDirective)
    app.add_directive("pgqueue-transitions", TransitionsDirective)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
