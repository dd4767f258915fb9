"""The API of providers, daemons (list, register, show, drop) and lakeshore.yaml
(apply, export)."""

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts import heavy
from accounts.permissions import DaemonProtocol
from fleet import daemons, declarative, registration, services
from fleet.api import serializers as s
from fleet.filters import DaemonFilter
from fleet.models import Daemon, Provider
from lakeshore_admin.api_docs import errors
from lakeshore_admin.pagination import LIMIT, OFFSET, LimitOffset, filtered, list_response


class ProviderList(APIView):
    pages = LimitOffset(default=100, maximum=1000)

    @extend_schema(
        summary="List providers",
        parameters=[LIMIT, OFFSET],
        responses={200: s.ProviderSerializer(many=True), **errors(400)},
    )
    def get(self, request):
        rows, link = self.pages.paginate(Provider.objects.order_by("name"), request)
        return list_response(rows, link, s.ProviderSerializer)

    @extend_schema(
        summary="Add a provider (config holds no credentials: name them with credential_ref)",
        request=s.ProviderInput,
        responses={201: s.ProviderSerializer, **errors(400, 409)},
    )
    def post(self, request):
        data = s.ProviderInput(data=request.data)
        data.is_valid(raise_exception=True)
        provider = services.provider_create(**data.validated_data)
        return Response(s.ProviderSerializer(provider).data, status=status.HTTP_201_CREATED)


class ProviderDetail(APIView):
    @extend_schema(
        summary="One provider, with its live status",
        responses={200: s.ProviderDetailSerializer, **errors(404)},
    )
    def get(self, request, name):
        return Response(s.ProviderDetailSerializer(services.provider_get(name)).data)

    @extend_schema(
        summary="Change a provider's description or config",
        request=s.ProviderPatch,
        responses={200: s.ProviderSerializer, **errors(400, 404)},
    )
    def patch(self, request, name):
        data = s.ProviderPatch(data=request.data)
        data.is_valid(raise_exception=True)
        provider = services.provider_patch(name=name, changes=data.validated_data)
        return Response(s.ProviderSerializer(provider).data)

    @extend_schema(
        summary="Remove a provider (refused while a queue uses it)",
        responses={204: None, **errors(404, 409)},
    )
    def delete(self, request, name):
        services.provider_delete(name=name)
        return Response(status=status.HTTP_204_NO_CONTENT)


class DaemonList(APIView):
    pages = LimitOffset(default=100, maximum=1000)

    @extend_schema(
        summary="List daemons, newest first",
        parameters=[
            OpenApiParameter("queue", str, description="subscribed to this queue"),
            OpenApiParameter("state", str, many=True),
            LIMIT,
            OFFSET,
        ],
        responses={200: s.DaemonSerializer(many=True), **errors(400)},
    )
    def get(self, request):
        queryset = filtered(DaemonFilter, request, Daemon.objects.for_list().order_by("-id"))
        rows, link = self.pages.paginate(queryset, request)
        return list_response(rows, link, s.DaemonSerializer)


class DaemonRegisterView(APIView):
    permission_classes = [DaemonProtocol]

    @extend_schema(
        summary="A daemon announces itself and its queues ([] = the default queue)",
        description="Answers the daemon and, once, its own credential in `token`: from "
        "then on only that credential (or an operator) speaks for the daemon; the token "
        "that registered it may register more but never acts as them. A token scoped to "
        "queues registers daemons on those only (403 queue_not_in_scope). A daemon's own "
        "credential registers no other daemon (403 not_your_daemon); a token holds at most "
        "LAKESHORE_DAEMONS_PER_TOKEN live daemons (429 daemons_per_token).",
        request=s.DaemonRegister,
        responses={201: s.RegisteredDaemonSerializer, **errors(400, 403, 429)},
    )
    def post(self, request):
        data = s.DaemonRegister(data=request.data)
        data.is_valid(raise_exception=True)
        daemon, credential = registration.daemon_register(
            owner=request.user, token=request.auth, **data.validated_data
        )
        # A new daemon (its credential issued just now) is answered as made; one whose
        # own credential registered it was updated in place: read again.
        registered = daemon if credential is not None else services.daemon_get(daemon.pk)
        registered.credential = credential
        return Response(
            s.RegisteredDaemonSerializer(registered).data, status=status.HTTP_201_CREATED
        )


class DaemonDetail(APIView):
    @extend_schema(summary="One daemon", responses={200: s.DaemonSerializer, **errors(404)})
    def get(self, request, daemon_id):
        return Response(s.DaemonSerializer(services.daemon_get(daemon_id)).data)

    @extend_schema(
        summary="Drop a daemon: terminate it; its running invocation ends killed",
        responses={200: OpenApiTypes.OBJECT, **errors(404)},
    )
    def delete(self, request, daemon_id):
        return Response(daemons.daemon_drop(daemon=services.daemon_get(daemon_id)))


class Apply(APIView):
    @extend_schema(
        summary="Apply a lakeshore.yaml document, all or nothing (dry_run: plan only)",
        description="Creates and updates the declared providers, then queues, through the "
        "same rules as the other endpoints; with prune, removes the queues and then the "
        "providers it does not declare (never forced). A field the document leaves out is "
        "left alone. Errors name the document path in `fields` (`queues[1].elasticity.kind`)."
        " A removal that is refused (a queue with bound daemons or work, a provider in use) "
        "refuses the whole plan, dry run or not: 409 `apply_refused`, with every item in "
        "`error.items` and each refused one's `refused: {code, message}`; nothing changes."
        " Applying and planning (dry_run) both need the operator role. One apply runs at a "
        "time: another one answers 409 `apply_in_progress` at once. At most "
        "LAKESHORE_APPLY_MAX_ITEMS providers and queues (400); a row locked by other work "
        "for LAKESHORE_APPLY_LOCK_TIMEOUT: 503 `busy`; a user's heavy requests past "
        "LAKESHORE_HEAVY_PER_PRINCIPAL: 429 `busy`.",
        request=s.ApplyInput,
        responses={200: s.ApplyResult, **errors(400, 409, 429, 503)},
    )
    def post(self, request):
        with heavy.requests.one_of(request.user):
            declarative.refuse_too_many_items(request.data)
            data = s.ApplyInput(data=request.data)
            if not data.is_valid():
                raise exceptions.ValidationError(s.document_paths(data.errors))
            options = data.validated_data
            return Response(
                declarative.apply(
                    document=options["document"],
                    prune=options["prune"],
                    dry_run=options["dry_run"],
                )
            )


class Export(APIView):
    @extend_schema(
        summary="Every provider and queue as a lakeshore.yaml document (every field)",
        responses={200: s.DeclaredDocument, **errors(429)},
    )
    def get(self, request):
        with heavy.requests.one_of(request.user):
            return Response(declarative.export())
