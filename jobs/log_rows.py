"""How an attempt's log lines are kept in LogChunk rows (jobs/logs.py writes them): a
shipment's lines are joined to the attempt's last row while it is small, or make a new
row; the tail's oldest rows are cut past half of LAKESHORE_LOG_MAX_BYTES or of
LAKESHORE_LOG_MAX_ROWS."""

from django.conf import settings

from jobs.models import JobLog, LogChunk

CHUNK_MAX_LINES = 10_000  # lines in one chunk a daemon ships, and in one row
JOIN_MAX_BYTES = 64 * 1024  # a row grows to this by joining small shipments (at most)
_JOINED_FIELDS = ["count", "bytes", "streams", "times", "text"]


class KeptRows:
    """The LogChunk rows a shipment writes: new lines are joined to their attempt's last
    row (one read of those rows, by JobLog.last_row) while that row is of the same part
    (head or tail), they follow it, no lines were dropped between, and it stays within
    CHUNK_MAX_LINES lines and join_bytes(); else they make a new row. A daemon that
    ships a line at a time so fills a row, not a row a line."""

    def __init__(self, logs: dict[tuple[int, int], JobLog]):
        wanted = [log.last_row for log in logs.values() if log.last_row is not None]
        stored = LogChunk.objects.in_bulk(wanted) if wanted else {}
        self.logs = logs
        self.last = {key: stored.get(log.last_row) for key, log in logs.items()}
        self.made: list[tuple[tuple[int, int], LogChunk]] = []
        self.joined: dict[int, LogChunk] = {}  # stored rows that took new lines

    def joins(
        self, log: JobLog, first_line: int, size: int, count: int, dropped: int, *, in_head: bool
    ) -> bool:
        row = self.last[(log.invocation_id, log.attempt)]
        return (
            row is not None
            and not dropped
            and row.in_head == in_head
            and row.first_line + row.count == first_line
            and row.count + count <= CHUNK_MAX_LINES
            and row.bytes + size <= join_bytes()
        )

    def add(self, log, first_line, lines, sizes, dropped, *, in_head: bool) -> None:
        key = (log.invocation_id, log.attempt)
        if self.joins(log, first_line, sum(sizes), len(lines), dropped, in_head=in_head):
            row = self.last[key]
            row.count += len(lines)
            row.bytes += sum(sizes)
            row.streams += "".join(stream for stream, _, _ in lines)
            row.times = [*row.times, *(at for _, at, _ in lines)]
            row.text += "\n" + "\n".join(text for _, _, text in lines)
            if row.pk is not None:
                self.joined[row.pk] = row
            return
        row = new_row(log, first_line, lines, sizes, dropped, in_head=in_head)
        if in_head:
            log.head_rows += 1
        else:
            log.tail_rows += 1
        self.last[key] = row
        self.made.append((key, row))

    def save(self) -> None:
        """Write the new rows and the joined ones; each log notes its last row."""
        LogChunk.objects.bulk_create([row for _, row in self.made])
        if self.joined:
            LogChunk.objects.bulk_update(list(self.joined.values()), _JOINED_FIELDS)
        for key, row in self.last.items():
            if row is not None:
                self.logs[key].last_row = row.pk


def join_bytes() -> int:
    """The bytes a row grows to by joining: small against the tail's half, so that
    cutting the tail's oldest row cuts little."""
    return min(JOIN_MAX_BYTES, settings.LAKESHORE_LOG_MAX_BYTES // 16)


def new_row(log, first_line, lines, sizes, dropped, *, in_head: bool) -> LogChunk:
    return LogChunk(
        invocation_id=log.invocation_id,
        attempt=log.attempt,
        first_line=first_line,
        count=len(lines),
        bytes=sum(sizes),
        streams="".join(stream for stream, _, _ in lines),
        times=[at for _, at, _ in lines],
        text="\n".join(text for _, _, text in lines),
        dropped=dropped,
        in_head=in_head,
    )


CUT_BATCH = 1000  # the tail's oldest rows one look reads


def cut_tail(log: JobLog, half: int, rows_half: int) -> None:
    """Delete the tail's oldest rows while it holds more than half the bytes, or more
    than half the rows."""
    while log.tail_bytes > half or log.tail_rows > rows_half:
        oldest = LogChunk.objects.filter(
            invocation_id=log.invocation_id, attempt=log.attempt, in_head=False
        ).order_by("first_line")
        doomed = []
        for row in oldest.values("pk", "count", "bytes")[:CUT_BATCH]:
            if log.tail_bytes <= half and log.tail_rows <= rows_half:
                break
            doomed.append(row["pk"])
            log.tail_bytes -= row["bytes"]
            log.tail_rows -= 1
            log.cut_lines += row["count"]
            log.cut_bytes += row["bytes"]
        if not doomed:
            return
        LogChunk.objects.filter(pk__in=doomed).delete()
        if log.last_row in doomed:
            log.last_row = None
