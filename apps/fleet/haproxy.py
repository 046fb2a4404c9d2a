"""HAProxy's configuration for a fleet of serving nodes: adapter-affinity routing.

The public listener buffers each request (``option http-buffer-request``), reads the model from
the JSON body (``json_query('$.model')``) and the API key's prefix from ``Authorization``, and
hashes ``<prefix>/<model>`` (``nodes.route_key``) with ``hash-type consistent`` and a
``hash-balance-factor``: consistent hashing with bounded loads, so one tenant's alias stays on
the node that holds it until that node carries more than ``factor`` times the average load,
and then spills to the next node on the ring instead of overloading one.

Why the key prefix and not the tenant: HAProxy sees only the request; the prefix is in it and
names exactly one tenant, with no lookup table to keep in step. A tenant with several keys may
have an alias hot on up to that many nodes; alias-level warm and evict (``nodes.alias_action``)
send one call per key through the internal listener, which hashes the same key from the
``X-Lorahub-Route`` header, so HAProxy alone decides the owner (no second hash ring).

Every server has a fixed ``id`` derived from its name: HAProxy places servers on the ring by
id, so adding, removing or reordering nodes moves only the keys of the nodes that changed.
``/healthz`` health checks take a node out while its engine starts or restarts (503) and
when it is gone; a request whose node refused the connection or closed it before answering
or answered 503 (a node draining before it stops, see ``node/drain.py``) is retried on the next
node (``retry-on``, ``option redispatch``), so when a node dies only the answers it had already
started streaming are cut, and a node that stops cleanly cuts none.
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass
from urllib.parse import urlsplit

# set on every request the public entrance forwards: a node answers /internal/ to none of them
PUBLIC_ENTRY_HEADER = "X-Lorahub-Entry"


@dataclass(frozen=True)
class Backend:
    name: str
    url: str


def default_factor(nodes: int) -> int:
    """150 (at most 1.5x the mean load) up to 4 nodes, 200 above: ``bench/fleet.py`` shows
    the tighter bound costing 4-7 points of hit rate at 16 nodes and under 3.5 at 4."""
    return 150 if nodes <= 4 else 200


def server_id(name: str, taken: set[int]) -> int:
    """A stable id in [1, 2^31) for a server name (the next free one on a collision)."""
    ident = zlib.crc32(name.encode()) % (2**31 - 2) + 1
    while ident in taken:
        ident = ident % (2**31 - 2) + 1
    taken.add(ident)
    return ident


def _server_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.:-]", "_", name) or "node"


def _address(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname or not parts.port:
        raise ValueError(
            f"node address {url!r} must look like http://host:port "
            "(HAProxy talks plain HTTP to nodes on the private network)"
        )
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{host}:{parts.port}"


TEMPLATE = """\
# lorahub: adapter-affinity routing over {nodes} serving node(s).
# Rendered by `manage.py haproxy_config`; re-render and reload HAProxy after adding a node.
global
    maxconn 4096
    # the routing key is read from the request body, which must fit in one buffer
    tune.bufsize 262144
{stats}
defaults
    mode http
    timeout connect 2s
    timeout client 10m
    timeout server 10m
    timeout http-request 30s
    timeout queue 30s
    timeout check 3s
    # a node that refuses the connection, dies before answering or answers 503 (draining on
    # its way out, engine restarting, overloaded): try the next one (the body is buffered, and
    # a completion that never started has no effect to repeat)
    option redispatch 1
    retries 2
    retry-on conn-failure empty-response 503

frontend inference
    bind {bind}
    option http-buffer-request
    # the caller's address for the node: the address this router saw, replacing whatever the
    # caller wrote (the node believes it from LORAHUB_TRUSTED_PROXIES only, lorahub/addresses.py)
    http-request set-header X-Forwarded-For %[src]
    # the node's control API is never public: refused here on the path decoded twice, any
    # segment of it (/%69nternal/, //internal/, /x/../internal/), and by the node for anything this
    # entrance forwards ({PUBLIC_ENTRY_HEADER} is set here, whatever a caller sent)
    http-request deny deny_status 404 if {{ path,url_dec,url_dec,lower -m reg (^|/)internal(/|$) }}
    http-request set-header {PUBLIC_ENTRY_HEADER} public
    http-request set-var(txn.model) req.body,json_query('$.model') if {{ method POST }}
    http-request set-var(txn.key) req.hdr(authorization),word(2,' '),field(2,'_')
    http-request set-var(txn.route) var(txn.key),concat('/',txn.model)
    default_backend nodes

frontend internal
    bind {internal_bind}
    http-request set-var(txn.route) req.hdr(x-lorahub-route)
    default_backend nodes

{resolvers}backend nodes
    balance hash var(txn.route)
    hash-type consistent sdbm avalanche
    hash-balance-factor {factor}
    option httpchk GET /healthz
    http-check expect status 200
    default-server check inter {check_interval_ms}ms fall 2 rise 2{resolve}
{servers}
"""


def render(
    backends: list[Backend],
    *,
    bind: str = "127.0.0.1:8080",
    internal_bind: str = "127.0.0.1:8091",
    balance_factor: int | None = None,
    check_interval_ms: int = 1000,
    stats_socket: str = "",
    dns: bool = False,
) -> str:
    """The whole ``haproxy.cfg``. ``bind`` takes tenants' requests; ``internal_bind`` takes
    the control plane's calls to ``/internal/*`` and must stay on a private interface.

    ``dns``: the nodes' host names are resolved while HAProxy runs (the name servers of
    ``/etc/resolv.conf``), not once at start: a node whose name does not resolve yet is down,
    not an error, and takes traffic once it resolves and passes its checks. For nodes with
    stable names that come and go (compose services, a StatefulSet's pods): render once for
    every name there may be, and no one edits the configuration when nodes join or leave."""
    factor = balance_factor if balance_factor is not None else default_factor(len(backends))
    if factor and factor <= 100:
        raise ValueError("the balance factor is a percentage above 100 (e.g. 150), or 0 for none")
    taken: set[int] = set()
    servers = [
        f"    server {_server_name(b.name)} {_address(b.url)} id {server_id(b.name, taken)}"
        for b in sorted(backends, key=lambda b: b.name)
    ]
    if not servers:
        servers = ["    # no node registered yet: start one, then re-render and reload"]
    stats = f"    stats socket {stats_socket} mode 600 level admin\n" if stats_socket else ""
    resolvers = (
        "resolvers dns\n"
        "    parse-resolv-conf\n"
        "    hold valid 5s\n"
        "    hold nx 2s\n"
        "    hold obsolete 2s\n\n"
        if dns
        else ""
    )
    # a name that does not resolve at start: the server waits, down, for the resolver
    resolve = " resolvers dns init-addr last,libc,none resolve-prefer ipv4" if dns else ""
    return TEMPLATE.format(
        nodes=len(backends),
        stats=stats,
        bind=bind,
        internal_bind=internal_bind,
        PUBLIC_ENTRY_HEADER=PUBLIC_ENTRY_HEADER,
        resolvers=resolvers,
        factor=factor,
        check_interval_ms=check_interval_ms,
        resolve=resolve,
        servers="\n".join(servers),
    )
