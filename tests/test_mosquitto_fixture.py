"""The broker fixture itself: a real Mosquitto that takes a connection and can restart."""

import socket

from tests.helpers import MosquittoProcess


def test_fixture_listens_and_restarts(mosquitto: MosquittoProcess) -> None:
    socket.create_connection(("127.0.0.1", mosquitto.port), timeout=2).close()
    mosquitto.stop()
    try:
        socket.create_connection(("127.0.0.1", mosquitto.port), timeout=0.5).close()
        raise AssertionError("the broker still listens after stop()")
    except OSError:
        pass
    mosquitto.start()
    socket.create_connection(("127.0.0.1", mosquitto.port), timeout=2).close()
