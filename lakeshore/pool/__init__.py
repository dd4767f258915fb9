"""A daemon's job processes: started, fed, watched and stopped (used by lakeshore.worker).

Each job process runs `python -m lakeshore.runner` and speaks with the daemon over a
pipe pair of its own, one JSON line each way (see lakeshore.runner); its stdout and
stderr are the daemon's, so what a job prints goes to the daemon's log.

Isolation:

- "pool" (the default): each slot keeps a warm job process that runs invocations one
  after another. It is replaced after `max_tasks` invocations, after an invocation that
  failed (it may have left state behind), after one that left processes or threads
  running, when its resident memory (VmRSS) passes `max_memory_mb` after an
  invocation, and when it dies or is killed (timeout, stop). Replacements are started
  by the claim loop's thread before it claims (or when it hands out work).
- "process": a fresh process per invocation, started when the invocation is handed
  out, which ends when its process exits. The invocations handed out together have
  their processes forked together, just before (`Pool.fork_ahead`: every request sent
  to the template before its first answer is read); each runs one invocation, whose id
  the runner sets as a pool process's. It is forked from the job template
  (`template`, `forkserver`: an interpreter started once, which imported the runner
  and what the allowed modules import) and runs the same runner; it is the daemon's
  own child all the same (clone with CLONE_PARENT), so everything below holds for it.
  Where no template can run, it is a fresh `python -m lakeshore.runner --once`.

Either way a job process leads a process group of its own, dies with the thread that
started it (PR_SET_PDEATHSIG: only the thread running Worker.run, which outlives them
all, starts them), has the scrubbed environment the daemon gives it, and whenever the daemon
stops one (timeout, drop, stop, replacement) or one exits, its whole group is killed.

One monitor thread learns of every outcome and every exit at once: a selector over the
processes' outcome pipes and their pidfds (exit), which also wakes for the nearest
timeout. It never starts a process.

Where things are: `pool` (Pool: its settings and state, the spawner's side that starts
processes and hands them invocations, and what any thread may do: kill, signal, close),
`monitor` (the monitor thread: outcomes, exits, timeouts), `job_process` (JobProcess,
one runner process and the pipes to it; Running, an invocation the daemon runs),
`processes` (starting a job process that dies with the daemon, killing its group,
reading its memory), `template` (the daemon's side of the job template, and Forked, a
process forked from it) and `forkserver` (the template process itself). The job's side
of the pipes is lakeshore.runner."""
