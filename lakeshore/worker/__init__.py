"""The daemon: registers, heartbeats, claims invocations of its queues, runs them in job
processes (`lakeshore.pool`, `lakeshore.runner`), and reports outcomes in batches. It
rides out server restarts (retries with back-off) and, on SIGTERM, stops claiming,
finishes what it runs and deregisters. HTTP only: no Django here.

Threads: the spawner (the thread running `Worker.run`, the only one that starts job
processes: it starts what the claim loop claimed, as slots free up), the claim loop,
the pool's monitor (learns of each outcome, exit and timeout at once), the
reporter (sends outcomes in batches: at REPORT_BATCH of them or REPORT_LINGER seconds
after the first, so the claim loop never waits on a report) and the heartbeat, which
carries the ids the daemon holds (running, or ended and not yet reported) so that the
server requeues work whose claim answer never arrived.

One request per job: a finished job frees a slot, so the claim loop is about to claim
again; it takes the outcomes waiting and sends them with its claim (POST …/exchange/:
recorded first, then the claim, which then does not long-poll). While the claim loop
is on its way to a request or in an exchange, outcomes wait for it rather than leave
after the linger (a full batch still leaves); while it long-polls (nothing to claim),
is stopping or registering, the reporter sends them on their own (POST …/complete/).
A server without exchange (404) gets complete and claim apart, as before. Outcomes do
not leave in parallel with an exchange in flight: that splits the batches into more,
smaller requests (docs/decisions/0006-daemon-exchange-and-claiming-ahead.md).

Claiming ahead: while the last jobs ran shorter than AHEAD_BELOW (0.1 s) on average, the
claim loop may hold more than its slots (as many more as the slots run in AHEAD_WAIT,
50 ms, and at least one a slot), so the slot a job frees while a claim is in flight
gets its next job at once, from the spawner, without waiting for that answer; the
claim then carries every outcome that ended during its round trip. No more than
`concurrency` jobs ever run at once; a job's time-out counts from its start; what is
claimed ahead is held (heartbeats name it) and is started even while draining. Long jobs
are never claimed ahead: one would wait behind another's whole run while another daemon
might be idle. One claim is in flight at a time: two at once, each for the slots free,
made the batches small (the same record). While every slot has its next job waiting,
a claim waits for half the room to be free (BATCH_WAIT at most): it would otherwise
go for the few that just ended, one request every few jobs.

Dispatch safety: a job process must never outlive the daemon that claimed it, or the
reaper would hand the work to another daemon while the first copy still runs.

- Each job process leads a session (and process group) of its own, and asks the
  kernel for SIGKILL when its parent dies (PR_SET_PDEATHSIG). Linux sends that signal
  when the *thread* that forked the child exits, so only the thread running
  `Worker.run` (the spawner) starts job processes, pool processes included, and it
  kills them all before it returns. A kill -9 of the daemon kills its job processes too.
  With `--isolation process` the spawner starts the job template, which forks each job
  process as the spawner's own child (clone with CLONE_PARENT), so the same holds.
- Whenever the daemon stops a job (timeout, the server no longer counts it as ours,
  drop, hard stop), when it replaces a pool process, and when a job's process exits, it
  kills the process's whole group, so what the job started (grandchildren in the same
  group) dies with it; a pool process also kills, between invocations, the processes
  the one before left (and is then replaced). Known limit: a kill -9 of the daemon
  kills the job process, but not the children it started (PDEATHSIG is not inherited),
  nor anything that left the group (setsid).
- Job processes get a scrubbed environment (JOB_ENV, LAKESHORE_JOB_ENV): no server
  setting and no token reaches them through it. (A job runs as the daemon's user, so
  it could still read /proc/<daemon pid>/environ or the CLI's auth.yml; closing that
  needs jobs run as another user, which this daemon does not do.)
- The daemon branches on the server's error `code`, never on its message.

Where things are: the daemon is one object of parts, each with its own state and a few
methods, composed by `daemon.Worker` (which also registers, runs, stops on signals,
deregisters, and registers again once lost). `slots.Slots` owns what the daemon holds
(the running invocations, what was claimed and not yet started, the lock that guards
them, lent to the job pool) and the spawner's loop; the others go through its methods.
`claim_loop.ClaimLoop` (claiming, claiming ahead, the exchange), `reporting` (Outcome;
the Reporter's batches; the Completer, the complete requests and their answers),
`logs.Shipper` (what jobs print), `heartbeat.Heartbeat` (beats, held ids, reconciling
with the server), `orders.Orders` (operators' orders: daemon exec), `calls.Session`
(the daemon's id and credential, requests with retries, the error codes),
`stopping.Stopping` (the stop flags every part reads); `environment` holds the job
processes' environment."""
