"""Two first polls of one SDK worker id at once make one daemon, not an error; and what
the SDK's hot calls cost in statements."""

import threading

import msgpack
import pytest
from django.contrib.auth import get_user_model
from django.db import connection

from fleet import registration
from fleet.models import Daemon
from lakeshore_admin import hooks
from tests.support import builders

ENVELOPE = msgpack.packb(
    {"v": 1, "id": "x", "fn": {"kind": "ref", "module": "m", "qualname": "f"}},
    use_bin_type=True,
)


@pytest.mark.django_db(transaction=True)
def test_two_first_polls_of_one_worker_id_at_once_make_one_daemon():
    builders.queue(name="gpu")
    owner = builders.daemon().owner or _user()
    other_made_it = []

    def the_other_poll_first():
        hooks.clear("sdk_worker.before_create")  # the other one goes straight through

        def poll():
            try:
                other_made_it.append(
                    registration.sdk_worker_seen(owner=owner, worker_id="h-1", queue="gpu").pk
                )
            finally:
                connection.close()

        thread = threading.Thread(target=poll)
        thread.start()
        thread.join(30)

    hooks.register("sdk_worker.before_create", the_other_poll_first)
    try:
        mine = registration.sdk_worker_seen(owner=owner, worker_id="h-1", queue="gpu")
    finally:
        hooks.clear()
    assert other_made_it == [mine.pk]
    assert Daemon.objects.filter(worker_id="h-1").count() == 1


def _user():
    return get_user_model().objects.create_user("sdk-owner")


@pytest.mark.django_db
def test_the_sdks_submit_and_a_warm_poll_cost_a_bounded_number_of_statements(
    api, django_assert_max_num_queries
):
    builders.queue(name="gpu")
    operator, daemon = builders.token("operator"), builders.token("daemon")

    def call(path, body, token):
        return api.post(
            path,
            data=msgpack.packb(body, use_bin_type=True),
            content_type="application/x-msgpack",
            HTTP_AUTHORIZATION=f"Bearer {token}",
        )

    submit = {"queue": "gpu", "args_blob": ENVELOPE, "run_config": {"queue": "gpu"}}
    call("/v1/namespaces/default/producer/submit", submit, operator)  # the token's first use
    with django_assert_max_num_queries(3):  # token, roles, the INSERT
        assert call("/v1/namespaces/default/producer/submit", submit, operator).status_code == 201
    poll = {"worker_id": "h-1", "queue": "gpu", "timeout_s": 0}
    call("/v1/daemon/poll", poll, daemon)  # registers, and takes the first job
    call("/v1/namespaces/default/producer/submit", submit, operator)
    with django_assert_max_num_queries(12):
        answer = msgpack.unpackb(call("/v1/daemon/poll", poll, daemon).content)
    assert len(answer["commands"]) == 1
