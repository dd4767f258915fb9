"""What every command gets from the root group: the global options and a client."""

import functools
from dataclasses import dataclass

import click
import httpx

from lakeshore.client import Client
from lakeshore.config import Settings, resolve


@dataclass
class State:
    url: str | None = None
    token: str | None = None
    transport: httpx.BaseTransport | None = None  # tests answer HTTP without a server

    def settings(self) -> Settings:
        return resolve(self.url, self.token)

    def client(self, settings: Settings | None = None) -> Client:
        settings = settings or self.settings()
        return Client(settings.server, settings.token, transport=self.transport)


def pass_client(command):
    """Call the command with a `client` built from the global options as first argument."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        state = click.get_current_context().find_object(State) or State()
        return command(state.client(), *args, **kwargs)

    return wrapper
