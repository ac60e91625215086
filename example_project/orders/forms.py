"""The checkout form."""

from __future__ import annotations

import uuid

from django import forms

from orders.models import Customer, Product
from orders.services import APPROVED_CARD, DECLINED_CARD


class ProductChoiceField(forms.ModelChoiceField):  # type: ignore[type-arg]
    """Products with their price and the warehouse they ship from."""

    def label_from_instance(self, obj: Product) -> str:  # type: ignore[override]
        """Return the option text."""
        return f"{obj} ({obj.price}, ships from {obj.warehouse})"


class CheckoutForm(forms.Form):
    """Place one order; the hidden token makes a double submit find the same order."""

    checkout_token = forms.UUIDField(widget=forms.HiddenInput, initial=uuid.uuid4)
    customer = forms.ModelChoiceField(queryset=Customer.objects.all())
    product = ProductChoiceField(queryset=Product.objects.select_related("warehouse"))
    quantity = forms.IntegerField(min_value=1, max_value=20, initial=1)
    points_redeemed = forms.IntegerField(
        min_value=0, initial=0, label="Redeem loyalty points", required=False
    )
    card_number = forms.ChoiceField(
        label="Card",
        choices=[
            (APPROVED_CARD, "4242 4242 4242 4242 (approved)"),
            (DECLINED_CARD, "4000 0000 0000 0002 (declined: the order rolls back)"),
        ],
    )
