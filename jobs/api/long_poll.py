"""DRF views whose answer may wait for work (a daemon's claim and exchange): their
answer runs as steps (jobs/waits.py). Under the edge (edge/application.py) the
first wait is parked on the event loop (jobs/waits.PARKING), and this view renders the
answer when the steps end (`finish`), through DRF's own exception handling and
response finalizing; under any other server the steps sleep in the request's thread,
within LAKESHORE_MAX_WAITS."""

import functools
from collections.abc import Callable

from rest_framework.response import Response
from rest_framework.views import APIView

from jobs import waits


class LongPollView(APIView):
    def long_poll(self, request, steps: waits.Steps, respond: Callable[[object], Response]):
        """The answer of `steps`: `respond(what they return)`, now or once parked."""
        parking = request.META.get(waits.PARKING)
        if parking is None:
            return respond(waits.drive(steps))
        got = waits.first_step(steps)
        if waits.ended(got):
            return respond(got[1])
        parking.park(steps, got, functools.partial(self.finish, request, respond), request)
        return Response()  # the placeholder: the middleware's headers, never sent

    def finish(self, request, respond, value, error: BaseException | None):
        """The rendered answer of parked steps that returned `value` or raised `error`,
        as DRF's dispatch would have made it."""
        try:
            if error is not None:
                raise error
            response = respond(value)
        except Exception as exc:  # noqa: BLE001 - DRF's handling, as in its dispatch
            response = self.handle_exception(exc)
        response = self.finalize_response(request, response)
        return response.render()
