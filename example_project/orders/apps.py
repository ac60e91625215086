"""Django application configuration of the orders app."""

from django.apps import AppConfig


class OrdersConfig(AppConfig):
    """The shop's orders, customers, products and what the background jobs produce."""

    name = "orders"
    verbose_name = "Shop"
    default_auto_field = "django.db.models.BigAutoField"
