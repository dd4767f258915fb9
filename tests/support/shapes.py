"""The JSON shapes of SPEC "JSON shapes": the names the CLI, scripts and tests rely on."""

QUEUE_KEYS = {
    "name",
    "kind",
    "description",
    "state",
    "provider",
    "members",
    "elasticity",
    "instance_type",
    "image_id",
    "runner",
    "max_depth",
    "on_full",
    "temperature",
    "created_at",
    "updated_at",
}
DAEMON_KEYS = {
    "id",
    "name",
    "queues",
    "state",
    "provider",
    "instance_type",
    "external_id",  # beyond SPEC: the provider's id (a Slurm job id, a pid)
    "log_path",  # beyond SPEC: where a provider-launched daemon logs
    "current_invocation",
    "last_heartbeat_at",
    "created_at",
}
EVENT_KEYS = {
    "id",
    "at",
    "action",
    "reason",
    "daemons",
    "busy",
    "pending",
    "utilization",
    "desired",
    "delta",
}
STATS_KEYS = {
    "daemons",
    "busy",
    "idle",
    "provisioning",
    "utilization",
    "pending",
    "running",
    "desired",
    "next_action",
    "recent_actions",
}
PROVIDER_KEYS = {"name", "kind", "description", "config", "created_at", "updated_at"}
