"""Django REST framework views guarded by @prevent_double_submit, decorated as a DRF user
would: an ``@api_view`` function, an ``APIView`` and a ``ViewSet`` with ``method_decorator``."""

import json
import secrets

from django.utils.decorators import method_decorator
from rest_framework import viewsets
from rest_framework.decorators import action, api_view
from rest_framework.parsers import BaseParser, JSONParser
from rest_framework.permissions import IsAuthenticated
from rest_framework.response import Response
from rest_framework.views import APIView

from django_redis_lock import prevent_double_submit
from tests.testapp.views import BY_CLIENT, gate, ran


def receipt(name, request):
    """What the view did, with a token no other run has: a replay shows the first run's."""
    ran(name)
    gate.wait(30)
    return Response({"item": request.data.get("item"), "order": secrets.token_hex(8)}, status=201)


@api_view(["POST"])
@prevent_double_submit(BY_CLIENT, wait=0)  # inside @api_view: it gets DRF's Request and Response
def api_order(request):
    return receipt("api_order", request)


@method_decorator(prevent_double_submit(BY_CLIENT, wait=0), name="post")
class OrderAPIView(APIView):
    def post(self, request):
        return receipt("order_api_view", request)


@method_decorator(prevent_double_submit(BY_CLIENT), name="post")  # duplicates wait
class PatientAPIView(APIView):
    def post(self, request):
        return receipt("patient_api_view", request)


class StreamParser(BaseParser):
    """Reads the request's stream, as all of DRF's parsers did before 3.16 and other parsers
    (YAML, MessagePack...) still do: ``request.body`` cannot be read after it."""

    media_type = "application/vnd.orders+json"

    def parse(self, stream, media_type=None, parser_context=None):
        return json.loads(stream.read())


@method_decorator(prevent_double_submit("user"), name="post")
class SessionOrderAPIView(APIView):
    """Session-authenticated: DRF's CSRF check reads ``request.POST``, which parses the body
    before the handler runs."""

    permission_classes = [IsAuthenticated]
    parser_classes = [JSONParser, StreamParser]

    def post(self, request):
        return receipt("session_order_api_view", request)


class OrderViewSet(viewsets.ViewSet):
    @method_decorator(prevent_double_submit(BY_CLIENT, wait=0))
    def create(self, request):
        return receipt("order_viewset_create", request)

    @action(detail=True, methods=["post"])
    @method_decorator(prevent_double_submit(BY_CLIENT, wait=0))
    def pay(self, request, pk=None):
        return receipt(f"order_viewset_pay:{pk}", request)
