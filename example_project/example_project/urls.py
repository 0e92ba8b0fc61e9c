from django.contrib import admin
from django.urls import path

from shop import views as shop

from . import views

urlpatterns = [
    path("", views.home, name="home"),
    path("shop/", shop.shop, name="shop"),
    path("shop/checkout/", shop.checkout, name="checkout"),
    path("admin/", admin.site.urls),
]
