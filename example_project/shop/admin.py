from django.contrib import admin

from .models import Order, Product

admin.site.register(Product, list_display=["name", "stock"])
admin.site.register(Order, list_display=["id", "product", "quantity", "created"])
