"""The domain's own settings: the controller, retries, retention, bounds and waits
(settings.py takes every name here; README's Settings table says what each means)."""

from lakeshore.allow import MODULES_EXPECTED, not_modules
from lakeshore_admin.env import BadSetting, env_list, env_number, env_str

LAKESHORE_TICK_SECONDS = env_number("LAKESHORE_TICK_SECONDS", 10, minimum=1)
# How often the console's tables and signals refresh themselves.
LAKESHORE_CONSOLE_REFRESH_SECONDS = env_number("LAKESHORE_CONSOLE_REFRESH_SECONDS", 5, minimum=1)
LAKESHORE_HEARTBEAT_TIMEOUT = env_number("LAKESHORE_HEARTBEAT_TIMEOUT", 60, minimum=2)
LAKESHORE_MAX_LAUNCH_PER_TICK = env_number("LAKESHORE_MAX_LAUNCH_PER_TICK", 10, minimum=1)
LAKESHORE_SCALE_DOWN_WINDOW = env_number("LAKESHORE_SCALE_DOWN_WINDOW", 300, minimum=0)
LAKESHORE_BLOCK_TIMEOUT = env_number("LAKESHORE_BLOCK_TIMEOUT", 30, minimum=0, kind=float)
# A failed attempt with attempts left waits min(MAX, BASE × 2^(attempt−1)) seconds, times
# a random factor in [0.5, 1) (jitter), before it can be claimed again.
LAKESHORE_RETRY_BACKOFF = env_number("LAKESHORE_RETRY_BACKOFF", 1, minimum=0, kind=float)
LAKESHORE_RETRY_BACKOFF_MAX = env_number("LAKESHORE_RETRY_BACKOFF_MAX", 300, minimum=0, kind=float)
# A daemon's row is rewritten for a heartbeat at most this often (state changes: always).
LAKESHORE_HEARTBEAT_WRITE_SECONDS = env_number(
    "LAKESHORE_HEARTBEAT_WRITE_SECONDS", 5, minimum=0, kind=float
)
LAKESHORE_MAX_DAEMONS_PER_QUEUE = env_number("LAKESHORE_MAX_DAEMONS_PER_QUEUE", 1000, minimum=1)
# Live daemons one token may have registered at once (a bootstrap daemon token's, or the
# token SDK workers poll with): past it, a registration answers 429 daemons_per_token
# until one of them ends (fleet/registration.admit_registration).
LAKESHORE_DAEMONS_PER_TOKEN = env_number("LAKESHORE_DAEMONS_PER_TOKEN", 1000, minimum=1)
LAKESHORE_MAX_TERMINATE_PER_TICK = env_number("LAKESHORE_MAX_TERMINATE_PER_TICK", 2, minimum=1)
LAKESHORE_STARTUP_GRACE = env_number("LAKESHORE_STARTUP_GRACE", 60, minimum=0)
# Seconds each Slurm client command (sbatch, squeue, scancel, sinfo) may take.
LAKESHORE_SLURM_TIMEOUT = env_number("LAKESHORE_SLURM_TIMEOUT", 30, minimum=1)
# Directories a slurm provider's `slurm_conf` may name a file under (Slurm's commands
# load plugins from where a slurm.conf says): comma-separated; empty allows none.
LAKESHORE_SLURM_CONF_DIRS = env_list("LAKESHORE_SLURM_CONF_DIRS", ["/etc/slurm"])
if any(not directory.startswith("/") for directory in LAKESHORE_SLURM_CONF_DIRS):
    raise BadSetting(
        "LAKESHORE_SLURM_CONF_DIRS", ",".join(LAKESHORE_SLURM_CONF_DIRS), "absolute directories"
    )
LAKESHORE_NOOP_RETENTION = env_number("LAKESHORE_NOOP_RETENTION", 86400, minimum=60)
# How long each read of a jobs search (the list, a bulk action's batch) may take before
# the search is refused as too broad (jobs/search.py).
LAKESHORE_SEARCH_TIMEOUT_SECONDS = env_number(
    "LAKESHORE_SEARCH_TIMEOUT_SECONDS", 10, minimum=0.1, kind=float
)
LAKESHORE_RETENTION_DAYS = env_number("LAKESHORE_RETENTION_DAYS", 30, minimum=1)
# The charts' samples (one per queue a minute; the charts show at most a day) and the
# audit trail of operator actions have retentions of their own.
LAKESHORE_SAMPLE_RETENTION_DAYS = env_number("LAKESHORE_SAMPLE_RETENTION_DAYS", 7, minimum=1)
LAKESHORE_AUDIT_RETENTION_DAYS = env_number("LAKESHORE_AUDIT_RETENTION_DAYS", 365, minimum=1)
# Issue 17: retention keeps pace, claims bounded by bytes
# The retention sweep (jobs/retention.py) runs every LAKESHORE_RETENTION_EVERY_SECONDS
# and deletes until nothing is due or its budget is spent (`manage.py prune`: no budget).
LAKESHORE_RETENTION_EVERY_SECONDS = env_number(
    "LAKESHORE_RETENTION_EVERY_SECONDS", 300, minimum=10, kind=float
)
LAKESHORE_RETENTION_BUDGET_SECONDS = env_number(
    "LAKESHORE_RETENTION_BUDGET_SECONDS", 60, minimum=0.1, kind=float
)
# A claim's answer holds invocations while the arguments before each come to less than
# this many bytes (args + kwargs + args_blob); always at least one.
LAKESHORE_CLAIM_MAX_BYTES = env_number("LAKESHORE_CLAIM_MAX_BYTES", 16 * 1024 * 1024, minimum=1)
# Modules (besides lakeshore.functions) whose functions the daemons that this server's
# providers start may run. Only the server's owner sets it: no API input can widen it.
LAKESHORE_ALLOWED_MODULES = env_list("LAKESHORE_ALLOWED_MODULES", [])
if not_modules(LAKESHORE_ALLOWED_MODULES):
    raise BadSetting(
        "LAKESHORE_ALLOWED_MODULES", ",".join(LAKESHORE_ALLOWED_MODULES), MODULES_EXPECTED
    )
# The Python SDK's wire (dreamlake-lakeshore: /v1/namespaces/<ns>/producer/*, /v1/daemon/*).
# This server is one namespace; any other answers 404.
LAKESHORE_SDK_NAMESPACE = env_str("LAKESHORE_SDK_NAMESPACE", "default").strip() or "default"
# The largest argument blob, result blob or result frame (bytes); above it: 413.
LAKESHORE_SDK_MAX_BLOB_BYTES = env_number(
    "LAKESHORE_SDK_MAX_BLOB_BYTES", 10 * 1024 * 1024, minimum=1024
)
# An SDK worker sends no heartbeat while it runs a job. Its job is kept for this long
# after its last poll or result chunk (or the job's run_config.timeout_s when set)
# before it is presumed dead and the job rerun.
LAKESHORE_SDK_LEASE_SECONDS = env_number("LAKESHORE_SDK_LEASE_SECONDS", 3600, minimum=1)
# Attempts an SDK invocation gets (its worker also says when a failure is final).
LAKESHORE_SDK_MAX_ATTEMPTS = env_number("LAKESHORE_SDK_MAX_ATTEMPTS", 3, minimum=1)
# A result stream with no new frame for this long ends (the SDK gives up after 30 s).
LAKESHORE_SDK_STREAM_IDLE_SECONDS = env_number(
    "LAKESHORE_SDK_STREAM_IDLE_SECONDS", 60, minimum=1, kind=float
)
# Issue 17: the SDK's result streams are bounded. Frames and bytes one stream may hold
# (past either, a chunk is refused: 413 stream_full), and the bytes one read of a stream
# loads from the database at a time (at least one frame).
LAKESHORE_SDK_STREAM_MAX_FRAMES = env_number("LAKESHORE_SDK_STREAM_MAX_FRAMES", 100_000, minimum=1)
LAKESHORE_SDK_STREAM_MAX_BYTES = env_number(
    "LAKESHORE_SDK_STREAM_MAX_BYTES", 256 * 1024 * 1024, minimum=1024
)
LAKESHORE_SDK_STREAM_READ_BYTES = env_number(
    "LAKESHORE_SDK_STREAM_READ_BYTES", 16 * 1024 * 1024, minimum=1024
)
# Issue 29: a topic (a stream that names no invocation) is its first writer's, and the
# topics one credential writes hold at most this many bytes together (and
# LAKESHORE_SDK_STREAM_MAX_FRAMES frames), however many topics, until retention sweeps
# them: past it, 413 stream_full. An invocation's stream is bounded by the invocation
# (one per attempt its writer holds), each within the bounds above.
LAKESHORE_SDK_TOPIC_BYTES_PER_CREDENTIAL = env_number(
    "LAKESHORE_SDK_TOPIC_BYTES_PER_CREDENTIAL", 256 * 1024 * 1024, minimum=1024
)
# Issue 19: per-job logs (jobs/logs.py). An attempt's log keeps at most this many bytes:
# past it, the first half and the last half are kept, with one marker line saying how
# much was cut between them.
LAKESHORE_LOG_MAX_BYTES = env_number("LAKESHORE_LOG_MAX_BYTES", 16 * 1024 * 1024, minimum=4096)
# Issue 29: and at most this many rows (a daemon's small shipments are joined into the
# attempt's last row; a chunk that must stand alone, with lines dropped before it, takes
# a row of its own): past it, the head and the tail keep half the rows each, and the
# oldest rows of the tail are cut, as past the bytes.
LAKESHORE_LOG_MAX_ROWS = env_number("LAKESHORE_LOG_MAX_ROWS", 10_000, minimum=4)
# Log lines for an attempt that ended more than this long ago are refused (409
# log_closed): a daemon ships an attempt's last lines before it reports its end.
LAKESHORE_LOG_APPEND_GRACE_SECONDS = env_number(
    "LAKESHORE_LOG_APPEND_GRACE_SECONDS", 60, minimum=0, kind=float
)
# Issue 17: long-poll admission (jobs/waits.py)
# At most this many requests of one server process sleep in a thread at once: the SDK's
# await and result stream, a log follow, and a claim, exchange or SDK poll that takes the
# full stack (the ASGI doors park the others: LAKESHORE_MAX_PARKED below). Past it a
# claim answers at once (empty, with Retry-After), the SDK's poll no command, its await
# the current state, and a stream that would wait 503 busy. The default leaves a quarter
# of the threads per process (LAKESHORE_WEB_THREADS, 128; at least 4) to heartbeats,
# completions and the console, which never wait: 128 threads admit 96 waits. 0 admits none.
LAKESHORE_WEB_THREADS = env_number("LAKESHORE_WEB_THREADS", 128, minimum=1)
LAKESHORE_MAX_WAITS = env_number(
    "LAKESHORE_MAX_WAITS",
    max(1, LAKESHORE_WEB_THREADS - max(4, LAKESHORE_WEB_THREADS // 4)),
    minimum=0,
)
# Under the ASGI server a daemon's claim and exchange, and an SDK worker's poll, wait on
# the event loop, holding no
# thread (jobs/waits.py): at most this many of them per server process, each a few KiB.
# Past it a claim answers at once, empty, with Retry-After, as above.
LAKESHORE_MAX_PARKED = env_number("LAKESHORE_MAX_PARKED", 10000, minimum=0)
# Issue 29: no caller holds more than its share of the database pool. A lakeshore.yaml
# applied may declare at most this many providers and queues together (counted before
# any is validated: past it, 400 naming this setting).
LAKESHORE_APPLY_MAX_ITEMS = env_number("LAKESHORE_APPLY_MAX_ITEMS", 1000, minimum=1)
# Seconds an apply waits for a row another request holds (a queue a daemon claims from)
# before it gives up, changing nothing: 503 busy, with Retry-After.
LAKESHORE_APPLY_LOCK_TIMEOUT = env_number(
    "LAKESHORE_APPLY_LOCK_TIMEOUT", 5, minimum=0.01, kind=float
)
# Heavy requests (an apply, a bulk cancel, an export) one user may have running at once
# in one server process; past it, 429 busy with Retry-After (accounts/heavy.py).
LAKESHORE_HEAVY_PER_PRINCIPAL = env_number("LAKESHORE_HEAVY_PER_PRINCIPAL", 2, minimum=1)
# Issue 29: a request's body. It is due within this many seconds of the request's head
# (edge/http_protocol.py): past it, 408 body_timeout and the connection closed.
# The web process receives a body on its event loop before a thread serves the request
# (edge/application.py), so a body that never comes holds no thread.
LAKESHORE_BODY_SECONDS = env_number("LAKESHORE_BODY_SECONDS", 20, minimum=0.1, kind=float)
# Bytes of request bodies one web process holds at once for the full stack (received on
# its event loop, then served; lakeshore_admin/asgi_io.Bodies): past it a request gets
# 503 busy with Retry-After, the rest of its body unread. Bodies of at most 64 KiB are
# not counted, and one body is always taken when no other is held.
LAKESHORE_BODY_BUFFER_BYTES = env_number(
    "LAKESHORE_BODY_BUFFER_BYTES", 256 * 1024 * 1024, minimum=0
)
# Issue 29: counts before cost. A JSON body (or admin form) may hold at most this many
# values (array items and object members, nested ones included), counted on its text
# before anything is decoded (lakeshore_admin/parsers.py); past it: 400 naming the
# setting. Legit bodies fit: a 10,000-invocation batch submit holds about 80,000, a
# daemon's log shipment at most 400,000 (lakeshore/joblog.SHIPMENT_MAX_LINES lines).
LAKESHORE_JSON_MAX_VALUES = env_number("LAKESHORE_JSON_MAX_VALUES", 500_000, minimum=1000)
# Issue 29: one principal (a token, or a console user) holds at most this many of a
# process's thread waits (LAKESHORE_MAX_WAITS) and parked waits (LAKESHORE_MAX_PARKED):
# past its share its wait answers at once, as past the whole bound, while others still
# wait. A daemon waits once at a time, an SDK worker a few; SDK workers that share a
# token share its share.
LAKESHORE_MAX_WAITS_PER_PRINCIPAL = env_number(
    "LAKESHORE_MAX_WAITS_PER_PRINCIPAL", max(1, LAKESHORE_MAX_WAITS // 4), minimum=0
)
LAKESHORE_MAX_PARKED_PER_PRINCIPAL = env_number(
    "LAKESHORE_MAX_PARKED_PER_PRINCIPAL", 1000, minimum=0
)
