"""Broker options on the command line, shared by `npcsim run`, `worker` and `subscribe`.

The login comes from the URL's user part or from NPCSIM_MQTT_USERNAME / NPCSIM_MQTT_PASSWORD
(so that a password need not appear in a process list); TLS files from --ca-file,
--cert-file and --key-file with an mqtts:// URL.
"""

from __future__ import annotations

import argparse

from sim.mqtt import BrokerAddress, TlsFiles

__all__ = ["add_broker_arguments", "broker_address", "tls_files"]

_LOGIN = "login: the URL's user part, or NPCSIM_MQTT_USERNAME / NPCSIM_MQTT_PASSWORD"


def add_broker_arguments(
    parser: argparse.ArgumentParser, *, default: str | None, auto: bool = False, found: str | None = None
) -> None:
    """--broker and the TLS files; `auto` documents `--broker auto` (npcsim run); `found` says
    where the broker comes from when --broker is not given (`subscribe`, `view`)."""
    kinds = "auto (a private Mosquitto), or mqtt[s]://[user@]host:port" if auto else "mqtt[s]://[user@]host:port"
    shown = f" (default {found or default})" if found or default else ""
    parser.add_argument("--broker", default=default, required=default is None and found is None, metavar="URL",
                        help=f"{kinds}{shown}; {_LOGIN}")
    parser.add_argument("--ca-file", metavar="FILE", help="mqtts: CA bundle to verify the broker (default: system CAs)")
    parser.add_argument("--cert-file", metavar="FILE", help="mqtts: client certificate (with --key-file)")
    parser.add_argument("--key-file", metavar="FILE", help="mqtts: the client certificate's private key")


def tls_files(args: argparse.Namespace) -> TlsFiles:
    return TlsFiles(ca_file=args.ca_file, cert_file=args.cert_file, key_file=args.key_file)


def broker_address(args: argparse.Namespace) -> BrokerAddress:
    """The parsed --broker with its login and TLS files; a ConfigError names what is wrong."""
    return BrokerAddress.parse(args.broker, tls=tls_files(args))
