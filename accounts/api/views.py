"""API tokens: list, create (with a role and, for daemon tokens, queues), revoke.
Operators only, on their own tokens (an administrator on anyone's: the rules are
accounts/services.py's); the secret of a new token is answered once."""

from datetime import timedelta

from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.api import serializers as s
from accounts.filters import TokenFilter
from accounts.models import ApiToken
from accounts.permissions import Operate
from accounts.services import token_mint, token_revoke, tokens_visible_to
from lakeshore_admin.api_docs import errors
from lakeshore_admin.errors import NotFound
from lakeshore_admin.pagination import LimitOffset, filtered, list_response


class TokenList(APIView):
    permission_classes = [Operate]

    @extend_schema(
        summary="List your API tokens (an administrator: everyone's), newest first, never "
        "their secrets",
        parameters=[
            OpenApiParameter("limit", int, description="1–200, default 50"),
            OpenApiParameter("offset", int, description="rows to skip, ≥ 0 (default 0)"),
            OpenApiParameter("user", str, description="only this user's tokens"),
            OpenApiParameter("role", str, description="only tokens of this role"),
            OpenApiParameter("usable", bool, description="only tokens that still work"),
        ],
        responses={200: s.TokenSerializer(many=True), **errors(400, 403)},
    )
    def get(self, request):
        visible = tokens_visible_to(request.user).order_by("-created_at", "-id")
        queryset = filtered(TokenFilter, request, visible)  # the tokens page's filters
        rows, link = LimitOffset().paginate(queryset, request)
        return list_response(rows, link, s.TokenSerializer)

    @extend_schema(
        summary="Create a token of a role (daemon tokens may be scoped to queues); the "
        "secret is answered once",
        description="Your own tokens, of a role you hold (403 role_above_yours); another "
        "user's only as an administrator (403 not_your_token). The token's user must hold "
        "its role (409 role_not_held) unless an administrator asks to grant it "
        "(`grant_role`).",
        request=s.TokenInput,
        responses={201: s.CreatedTokenSerializer, **errors(400, 403, 409)},
    )
    def post(self, request):
        data = s.TokenInput(data=request.data)
        data.is_valid(raise_exception=True)
        fields = data.validated_data
        days = fields["expires_days"]
        token, raw = token_mint(
            actor=request.user,
            username=fields["user"],
            role=fields["role"],
            name=fields["name"],
            queues=fields["queues"],
            grant_role=fields["grant_role"],
            expires_at=timezone.now() + timedelta(days=days) if days else None,
        )
        token.raw = raw
        return Response(s.CreatedTokenSerializer(token).data, status=status.HTTP_201_CREATED)


class TokenRevoke(APIView):
    permission_classes = [Operate]

    @extend_schema(
        summary="Revoke your token (an administrator: anyone's), at once (within "
        "LAKESHORE_TOKEN_CACHE_SECONDS)",
        request=None,
        responses={200: s.TokenSerializer, **errors(403, 404)},
    )
    def post(self, request, token_id):
        token = ApiToken.objects.select_related("user").filter(pk=_id(token_id)).first()
        if token is None:
            raise NotFound(f"Token {token_id} does not exist.")
        token_revoke(actor=request.user, token=token)
        return Response(s.TokenSerializer(token).data)


def _id(value: str) -> int:
    return int(value) if value.isdigit() and len(value) <= 18 else 0
