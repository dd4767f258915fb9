from rest_framework import serializers

from accounts.models import ApiToken, Role
from lakeshore_admin.strict_input import StrictInput


class TokenSerializer(serializers.ModelSerializer):
    id = serializers.CharField(read_only=True)
    user = serializers.CharField(source="user.username", read_only=True)

    class Meta:
        model = ApiToken
        fields = [
            "id",
            "prefix",
            "user",
            "role",
            "name",
            "queues",
            "bound",
            "created_at",
            "expires_at",
            "last_used_at",
            "revoked_at",
        ]


class CreatedTokenSerializer(TokenSerializer):
    token = serializers.CharField(
        source="raw", read_only=True, help_text="The secret, shown once: store it now."
    )

    class Meta(TokenSerializer.Meta):
        fields = [*TokenSerializer.Meta.fields, "token"]


class TokenInput(StrictInput):
    user = serializers.CharField(max_length=150)
    role = serializers.ChoiceField(choices=Role.choices)
    name = serializers.CharField(max_length=100, allow_blank=True, default="")
    queues = serializers.ListField(
        child=serializers.CharField(max_length=63),
        allow_null=True,
        default=None,
        max_length=64,
        help_text="Daemon tokens: the queues its daemons may serve (default: any).",
    )
    expires_days = serializers.IntegerField(min_value=1, max_value=3650, default=None)
    grant_role = serializers.BooleanField(
        default=False,
        help_text="Administrators: grant the user the token's role if it lacks it "
        "(audited as role.grant); without it, such a token is refused (role_not_held).",
    )
