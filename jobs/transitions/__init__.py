"""The job state machine: the one owner of invocation state changes.

    queued ──claim──▶ running ──complete──▶ succeeded | failed | timeout
       │                 │
       │                 ├──fail with attempts left / daemon gone──▶ queued (requeue)
       │                 └──daemon dropped / daemon exec kill──▶ killed
       └──kill / bulk-cancel / queue removed──▶ killed

Claim, complete, kill, drop, deregister, reap and the controller all change
invocations through the functions here, and nowhere else. Every change is one
conditional statement (the state it starts from is in its WHERE clause), so two
processes racing on a row can never both win; state names travel as parameters, not
as strings inside SQL. Terminal states never change.

Each function also counts what it changed for GET /metrics (lakeshore_admin/metrics.py),
from the rows its statement returns, once the transaction commits.

Where each change is, a module for each:

- `submit`: nothing → queued (submit, retry)
- `claim`: queued → running (a daemon's claim)
- `completion`: running → succeeded | failed | timeout, or back to queued for a failure
  with attempts left (a daemon's report); running → timeout past timeout_s (the reaper);
  a report that comes after a kill of its attempt changes no state, and the outcome it
  brought is kept as discarded (the job finished before the kill reached its daemon)
- `rescue`: running → queued, or failed with no attempt left, when its daemon is gone
  (leave, lost, deleted) or never got the claim's answer
- `kill`: queued → killed (kill, bulk-cancel, queue removed); running → killed (an
  operator's daemon exec kill, a drop)
- `states`: the state names the statements take, and running a statement

What each state allows (the console's buttons, the API's refusals) is read next to the
model (jobs/models.py); tests/jobs/test_transitions.py walks every function here from
every state."""
