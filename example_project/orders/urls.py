"""URLs of the storefront."""

from django.urls import path

from orders import views

app_name = "orders"

urlpatterns = [
    path("", views.home, name="home"),
    path("checkout/", views.checkout, name="checkout"),
    path("orders/<int:pk>/", views.order_detail, name="order"),
    path("customers/<int:pk>/statement/", views.statement, name="statement"),
]
