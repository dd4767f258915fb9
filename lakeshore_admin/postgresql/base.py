"""Django's PostgreSQL backend (subclassed, as Django's documentation on database
backends allows), whose general requests borrow within their share of the pool, and
whose features say what this project uses of PostgreSQL's.

A connection for a request of the general share (dbpool.share) waits for a place of
that share first (up to LAKESHORE_DB_POOL_TIMEOUT, then 503 as when the pool itself has
none), and gives the place back when the connection goes back to the pool. A request of
the daemon protocol, and code outside a request, borrow from the whole pool."""

import threading

from django.conf import settings
from django.db.backends.postgresql import base, features

from lakeshore_admin import dbpool


class DatabaseFeatures(features.DatabaseFeatures):
    # Only stored generated columns are used (jobs.Invocation.error_headline). Checking a
    # GeneratedField, Django asks about virtual ones first, which on PostgreSQL reads the
    # server's version: saying no keeps `manage.py check` off the database.
    supports_virtual_generated_columns = False


class DatabaseWrapper(base.DatabaseWrapper):
    features_class = DatabaseFeatures
    # alias → its GeneralShare: one per process, as Django keeps one pool per alias
    general_shares: dict[str, dbpool.GeneralShare] = {}
    general_shares_made = threading.Lock()

    general_place: dbpool.GeneralShare | None = None  # the place this connection holds

    def general_share(self) -> dbpool.GeneralShare | None:
        """This process's general share, or None when nothing is reserved (or no pool)."""
        reserve = settings.LAKESHORE_DB_POOL_RESERVE
        if not reserve or not self.pool:
            return None
        with self.general_shares_made:
            if self.alias not in self.general_shares:
                size = self.pool.max_size - reserve
                self.general_shares[self.alias] = dbpool.GeneralShare(size)
            return self.general_shares[self.alias]

    def get_new_connection(self, conn_params):
        self.give_back_place()  # a connection dropped without close() (none known) held one
        place = self.general_share() if dbpool.share.get() == dbpool.GENERAL else None
        if place is not None:
            place.take(timeout=settings.LAKESHORE_DB_POOL_TIMEOUT)
        try:
            connection = super().get_new_connection(conn_params)
        except BaseException:
            if place is not None:
                place.give_back()
            raise
        self.general_place = place
        return connection

    def close(self):
        try:
            super().close()
        finally:
            # with a pool, the connection is back in it (or dropped) once it is None
            if self.connection is None:
                self.give_back_place()

    def give_back_place(self) -> None:
        if self.general_place is not None:
            place, self.general_place = self.general_place, None
            place.give_back()
