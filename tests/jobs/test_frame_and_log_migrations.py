"""Issue 29's jobs migrations on rows stored before them: 0014 gives an invocation's
frames and stream totals the attempt their invocation is at (a topic's stay attempt 0),
and 0015 counts each attempt's log rows, in its head and its tail."""

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from jobs.models import JobLog, ResultFrame, ResultStream

BEFORE = [("jobs", "0013_notify_log_lines")]


@pytest.mark.django_db(transaction=True)
def test_rows_stored_before_take_their_attempt_and_their_row_counts():
    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE)
    old = executor.loader.project_state(BEFORE).apps
    Invocation = old.get_model("jobs", "Invocation")
    Frame, Stream = old.get_model("jobs", "ResultFrame"), old.get_model("jobs", "ResultStream")
    Log, Chunk = old.get_model("jobs", "JobLog"), old.get_model("jobs", "LogChunk")
    retried = Invocation.objects.create(function="f", state="succeeded", attempts=2).pk
    for stream in (str(retried), "a-topic"):
        Stream.objects.create(stream=stream, frames=2, bytes=2)
        for seq in range(2):
            Frame.objects.create(stream=stream, seq=seq, data=b"x", final=seq == 1)
    Log.objects.create(invocation_id=retried, attempt=2, lines=3)
    for line, in_head in ((0, True), (1, True), (2, False)):
        Chunk.objects.create(
            invocation_id=retried, attempt=2, first_line=line, count=1, bytes=2,
            streams="o", times=[1.0], text="a", in_head=in_head,
        )  # fmt: skip
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())
    attempts = dict(ResultFrame.objects.values_list("stream", "attempt").distinct())
    assert attempts == {str(retried): 2, "a-topic": 0}
    assert dict(ResultStream.objects.values_list("stream", "attempt")) == attempts
    log = JobLog.objects.get(invocation_id=retried, attempt=2)
    assert (log.head_rows, log.tail_rows, log.last_row) == (2, 1, None)
