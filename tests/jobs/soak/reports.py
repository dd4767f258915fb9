"""How a daemon thread reports what it ran: most threads as one list (the batch form of
complete), a few one request per outcome, so both paths are soaked. Only an accepted
answer counts in the ledger; a repeat of an accepted report (as after a lost response)
lands on the same (invocation, attempt) pair, so it is never counted twice."""

import time

import httpx

from tests.jobs.soak.http_calls import ALREADY, STALE, TERMINATED, error_code, let_go
from tests.jobs.soak.ledger import Run

FAIL_RATE = 0.02  # reports of a (transient) failure: the server requeues them
REPEAT_RATE = 0.02  # accepted successes are reported again, as after a lost response


class Reports:
    """The report half of a DaemonThread (tests/jobs/soak/daemon_thread.py), which mixes it in:
    it uses the thread's shared, rng, crash, fresh, _call, _release and _let_go."""

    def _outcome(self, run: Run) -> dict:
        run.outcome = "failed" if self.rng.random() < FAIL_RATE else "succeeded"
        return {
            "invocation": run.invocation,
            "attempt": run.attempt,
            "state": run.outcome,
            "result": {"n": run.invocation} if run.outcome == "succeeded" else None,
            "error": "" if run.outcome == "succeeded" else "soak: transient failure",
        }

    def _abandoned(self, runs: list[Run]) -> None:
        answer = "abandoned (crash)" if self.crash.is_set() else "abandoned (stop)"
        for run in runs:
            run.answer = answer

    def _report_one(self, daemon: int, run: Run) -> None:
        """One outcome, one request: 200 with the row, or 409 for this outcome alone."""
        stats = self.shared.stats
        body = self._outcome(run)
        url = f"daemons/{daemon}/complete/"
        stats.add("single reports")
        response, retried = self._call("POST", url, body)
        if response is None:
            self._abandoned([run])
            return
        self._release([run])
        if response.status_code == 200:
            self.fresh = time.monotonic()
            self._check_row(daemon, run, response.json())
            self.shared.ledger.accepted(run)
            stats.add(f"{run.outcome} reports accepted")
            if retried:
                stats.add("reports accepted after a retry")
            if run.outcome == "succeeded" and self.rng.random() < REPEAT_RATE:
                again, _ = self._call("POST", url, body, interruptible=False)
                if again is not None and let_go(again):
                    stats.add("repeated reports refused (the daemon let go)")
                elif again is not None:
                    if again.status_code != 200:
                        raise AssertionError(f"a repeated report: {again.status_code} {again.text}")
                    self._check_row(daemon, run, again.json())
                    self.shared.ledger.accepted(run)  # the same pair: counted once
                    stats.add("repeated reports answered 200")
            return
        if response.status_code == 401 and let_go(response):  # dropped: its credential too
            run.answer = f"refused whole ({TERMINATED})"
            stats.add("single reports refused (credential revoked)")
            if retried:
                self.shared.ledger.refused_after_retry(run)
            return
        code = error_code(response)
        if response.status_code != 409 or code not in (STALE, ALREADY):
            raise AssertionError(f"complete: {response.status_code} {response.text}")
        run.answer = code
        if code == STALE:
            stats.add("stale completions refused")
            stats.add("stale completions refused (single)")
            if retried:
                stats.add("stale after a retried report")
        else:
            state = response.json()["error"].get("state")
            stats.add(f"already_completed ({state})")
            if state != "killed":
                raise AssertionError(f"complete of {run}: {response.text}")

    def _check_row(self, daemon: int, run: Run, row: dict) -> None:
        want = ["succeeded"] if run.outcome == "succeeded" else ["queued", "failed"]
        ok = row["state"] in want and row["attempts"] == run.attempt
        ok = ok and row["worker"] == str(daemon) and int(row["id"]) == run.invocation
        if not ok and run.outcome == "failed" and row["attempts"] > run.attempt:
            # The server answers a recorded report with the row as it reads it *after*
            # the update: a requeued one may be claimed again by then (see the report).
            self.shared.stats.add("failure reports answered with a later claim's row")
            return
        if not ok:
            raise AssertionError(f"report of {run} answered {row}")

    def _report_list(self, daemon: int, runs: list[Run]) -> None:
        """The outcomes as one list: each answered alone ({"ok": true, "state"} or
        {"ok": false, "error": {"code": "claim_stale"}}), or the whole list refused with
        409 when the daemon is no longer live (nothing recorded)."""
        stats, ledger = self.shared.stats, self.shared.ledger
        body = [self._outcome(run) for run in runs]
        url = f"daemons/{daemon}/complete/"
        stats.add("list reports")
        stats.add("outcomes in list reports", len(runs))
        response, retried = self._call("POST", url, body)
        if response is None:
            self._abandoned(runs)
            return
        self._release(runs)
        code = let_go(response)
        if code:
            for run in runs:
                run.answer = f"refused whole ({code})"
                if retried:  # the first try may have been recorded, then the daemon lost
                    ledger.refused_after_retry(run)
            stats.add(f"list reports refused whole ({code})")
            stats.add("outcomes refused whole", len(runs))
            if retried:
                stats.add("list reports refused whole after a retry")
            self._let_go(code)
            return
        if response.status_code != 200:
            raise AssertionError(f"complete (list): {response.status_code} {response.text}")
        self.fresh = time.monotonic()
        succeeded = []
        for run, answer in self._answers(runs, response):
            if answer["ok"] is True:
                want = ["succeeded"] if run.outcome == "succeeded" else ["queued", "failed"]
                if answer.get("state") not in want:
                    raise AssertionError(f"list report of {run} answered {answer}")
                ledger.accepted(run)
                stats.add(f"{run.outcome} reports accepted")
                if retried:
                    stats.add("reports accepted after a retry")
                if run.outcome == "succeeded":
                    succeeded.append(run)
                continue
            code = (answer.get("error") or {}).get("code")
            if code != STALE:  # already_completed only for a killed one: it says claim_stale
                raise AssertionError(f"list report of {run} answered {answer}")
            run.answer = STALE
            stats.add("stale completions refused")
            stats.add("stale completions refused (in a list)")
            if retried:
                stats.add("stale after a retried report")
        if succeeded and self.rng.random() < REPEAT_RATE:
            self._repeat_list(daemon, succeeded, [b for b in body if b["state"] == "succeeded"])

    def _answers(self, runs: list[Run], response: httpx.Response):
        answers = response.json()
        if not isinstance(answers, list) or len(answers) != len(runs):
            raise AssertionError(f"{len(runs)} outcomes answered {response.text[:500]}")
        for run, answer in zip(runs, answers, strict=True):
            if answer.get("invocation") != str(run.invocation) or "ok" not in answer:
                raise AssertionError(f"list report of {run} answered {answer}")
            yield run, answer

    def _repeat_list(self, daemon: int, runs: list[Run], body: list[dict]) -> None:
        """Accepted successes reported again, as after a lost response: each answered
        ok (recorded once), or the whole list refused if the daemon was let go since."""
        stats = self.shared.stats
        url = f"daemons/{daemon}/complete/"
        again, _ = self._call("POST", url, body, interruptible=False)
        if again is None:
            return
        code = let_go(again)
        if code:
            stats.add("repeated list reports refused whole")
            self._let_go(code)
            return
        if again.status_code != 200:
            raise AssertionError(f"a repeated list report: {again.status_code} {again.text}")
        for run, answer in self._answers(runs, again):
            if answer["ok"] is not True or answer.get("state") != "succeeded":
                raise AssertionError(f"a repeated report of {run} answered {answer}")
            self.shared.ledger.accepted(run)  # the same pair: counted once
        stats.add("repeated list reports answered 200")
