"""Celery's broker when there is no broker server (`make run`, one machine): kombu's
filesystem transport, with each message written whole before a reader can take it.

kombu's own writes a message into the very file its readers look for: a reader that
lists the folder between the writer's open() and its write() moves away an empty file,
and the worker dies on it (JSONDecodeError); a writer killed there (beat, on a kill -9 of
`make run`) leaves an empty file that kills every later worker at its start. Here a
message is written under a name no reader takes (….msg.part) and renamed into place."""

import os
import uuid
from time import monotonic

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps


class Channel(filesystem.Channel):
    def _put(self, queue, payload, **kwargs):
        # The name as kombu's own (a reader takes "<anything>.<queue>.msg" in name order).
        name = f"{round(monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        partial = f"{final}.part"
        try:
            with open(partial, "wb") as out:
                out.write(str_to_bytes(dumps(payload)))
            os.replace(partial, final)  # atomic: a reader sees all of it or nothing
        except OSError as exc:
            raise ChannelError(f"Cannot add file {final!r} to directory") from exc


class Transport(filesystem.Transport):
    Channel = Channel
