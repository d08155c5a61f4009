"""Who may call which route of the management API, and which objects of a list they see:
RabbitMQ 3.10's rules (rabbit_mgmt_util:is_authorized_* and filter_*), declared per route.

Every handler carries one `@access(RULE, lists=FILTER)`; the auth middleware (warren.mgmt.app)
authenticates, refuses a user without any management tag ("Not management user"), then asks
the route's rule; `list_response` applies the route's list filter. A route without a declared
rule is for administrators only (fail closed).

The rules, by the RabbitMQ function they copy:

- ANY (is_authorized): any management user (management, policymaker, monitoring, administrator).
- ADMIN (is_authorized_admin): administrators ("Not administrator user").
- MONITOR (is_authorized_monitor): monitoring or administrator ("Not monitor user").
- VHOST (is_authorized_vhost): administrators, or a user with permissions in the vhost of the
  path ("User not authorised to access virtual host"); a path naming no existing vhost passes
  (the handler answers 404).
- POLICIES (is_authorized_policies): administrators, or a policymaker with permissions in the
  vhost ("User not authorised to access object").
- VHOST_VISIBLE (is_authorized_vhost_visible): as VHOST, and monitoring users pass for any vhost.
- GLOBAL_PARAMETERS (is_authorized_global_parameters): policymakers and administrators
  ("User not authorised to access object").
- CONTROL_SOCKET (Warren's): warrenctl on the node's control socket only, for what rabbitmqctl
  does and RabbitMQ's API has no route for (forget_cluster_node); no user over TCP passes.
- owner(lookup) (is_authorized_user): reading needs monitoring or the object's own user,
  closing needs administrator or the object's own user ("User not authorised to access
  object"). For connections and channels.

The list filters (what a non-privileged user sees of a list):

- IN_LOGIN_VHOSTS (filter_vhost): objects of the vhosts the user has permissions in; only
  administrators see all (monitoring users too are limited to their vhosts here).
- VISIBLE_VHOSTS (list_visible_vhosts, for /api/vhosts): monitoring and administrators see
  every vhost, others those they have permissions in.
- own(*key) (filter_user): monitoring and administrators see all, others their own (key is
  the path of the user name in the item, e.g. ("channel_details", "user")).

Operations over HTTP additionally check the AMQP permissions (configure/write/read regular
expressions) of the user on the resource, through the operations layer's Actor
(warren.mgmt.resources.actor): a management user may declare a queue only where AMQP would
let them.
"""

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from ..broker.auth import User

ADMINISTRATOR = "administrator"
MONITORING = "monitoring"
POLICYMAKER = "policymaker"
MANAGEMENT = "management"
MANAGEMENT_TAGS = frozenset((ADMINISTRATOR, MONITORING, POLICYMAKER, MANAGEMENT))

NOT_MANAGEMENT = "Not management user"
NOT_ADMIN = "Not administrator user"
NOT_MONITOR = "Not monitor user"
NOT_VHOST = "User not authorised to access virtual host"
NOT_OBJECT = "User not authorised to access object"


def is_management(user: User) -> bool:
    return bool(MANAGEMENT_TAGS.intersection(user.tags))


def is_admin(user: User) -> bool:
    return ADMINISTRATOR in user.tags


def is_monitor(user: User) -> bool:
    return ADMINISTRATOR in user.tags or MONITORING in user.tags


def is_policymaker(user: User) -> bool:
    return ADMINISTRATOR in user.tags or POLICYMAKER in user.tags


def login_vhosts(request: web.Request, user: User) -> set[str]:
    """The vhosts the user may open a connection to (has permissions in)."""
    broker = request.app["broker"]
    return {vhost for name, vhost in broker.permissions if name == user.name and vhost in broker.vhosts}


def visible_vhosts(request: web.Request, user: User) -> set[str]:
    """The vhosts whose existence and totals the user may see (all, for monitoring users)."""
    if is_monitor(user):
        return set(request.app["broker"].vhosts)
    return login_vhosts(request, user)


def _matches_vhost(request: web.Request, user: User) -> bool:
    """RabbitMQ's user_matches_vhost: true for a path without a vhost or with a missing one."""
    name = request.match_info.get("vhost")
    broker = request.app["broker"]
    if name is None or name not in broker.vhosts:
        return True
    return (user.name, name) in broker.permissions


# ------------------------------------------------------------------ rules
@dataclass(frozen=True)
class Rule:
    """Who may call a route: `allows(request, user)`, else a 401 with `reason`."""
    name: str
    reason: str
    allows: Callable[[web.Request, User], bool]


ANY = Rule("any management user", "", lambda request, user: True)
ADMIN = Rule(ADMINISTRATOR, NOT_ADMIN, lambda request, user: is_admin(user))
MONITOR = Rule(MONITORING, NOT_MONITOR, lambda request, user: is_monitor(user))
VHOST = Rule("permissions in the vhost", NOT_VHOST,
             lambda request, user: is_admin(user) or _matches_vhost(request, user))
POLICIES = Rule("policymaker with permissions in the vhost", NOT_OBJECT,
                lambda request, user: is_admin(user) or (is_policymaker(user) and _matches_vhost(request, user)))
# is_authorized_vhost_visible (vhost limits): as VHOST, but monitoring users see every vhost.
VHOST_VISIBLE = Rule("the vhost visible", NOT_VHOST,
                     lambda request, user: is_monitor(user) or _matches_vhost(request, user))
# is_authorized_global_parameters: policymakers and administrators.
GLOBAL_PARAMETERS = Rule(POLICYMAKER, NOT_OBJECT, lambda request, user: is_policymaker(user))
# Requests on the control socket skip the rules (warren.mgmt.app); every user over TCP fails this one.
NOT_CONTROL_SOCKET = "Only warrenctl on the node's control socket may do this"
CONTROL_SOCKET = Rule("warrenctl on the control socket", NOT_CONTROL_SOCKET, lambda request, user: False)


def _owner_allows(request: web.Request, user: User, lookup: Callable[[], str | None]) -> bool:
    privileged = is_admin(user) if request.method == "DELETE" else is_monitor(user)
    if privileged:
        return True
    name = lookup()
    return name is None or name == user.name


def owner(lookup: Callable[[web.Request], str | None]) -> Rule:
    """For an object that belongs to a user (a connection, a channel): `lookup` gives its
    user's name, or None if there is no such object on this node (the handler then answers
    404, RabbitMQ answers a non-monitoring user 500 there; or finds it on another cluster
    member and asks check_owner)."""
    return Rule("own object", NOT_OBJECT, lambda request, user: _owner_allows(request, user, lambda: lookup(request)))


def owner_refusal(request: web.Request, name: str | None) -> str | None:
    """The owner rule for an object found on another cluster member, whose user is `name`:
    None if the request's user may see (or close) it, else the reason of the 401."""
    user = request.get("user")
    return None if user is None or _owner_allows(request, user, lambda: name) else NOT_OBJECT


# ------------------------------------------------------------------ list filters
@dataclass(frozen=True)
class ListFilter:
    """Which items of a list a user sees: all if `sees_all(user)`, else those whose `key`
    (a path into the item) is one of `allowed(request, user)`."""
    key: tuple[str, ...]
    sees_all: Callable[[User], bool]
    allowed: Callable[[web.Request, User], set[str]]


IN_LOGIN_VHOSTS = ListFilter(("vhost",), is_admin, login_vhosts)
VISIBLE_VHOSTS = ListFilter(("name",), is_monitor, login_vhosts)
# Objects of a vhost (vhost limits) by the vhosts a user sees: monitoring users see all.
IN_VISIBLE_VHOSTS = ListFilter(("vhost",), is_monitor, login_vhosts)


def own(*key: str) -> ListFilter:
    return ListFilter(key or ("user",), is_monitor, lambda request, user: {user.name})


# ------------------------------------------------------------------ declaration
@dataclass(frozen=True)
class Access:
    rule: Rule
    lists: ListFilter | None = None


_DECLARED = "__warren_access__"
DEFAULT = Access(ADMIN)  # a route that declares nothing: administrators only


def access(rule: Rule, lists: ListFilter | None = None):
    """Declare a handler's rule and list filter (put it below the @routes decorator)."""
    def mark(handler):
        setattr(handler, _DECLARED, Access(rule, lists))
        return handler
    return mark


def declared(handler) -> Access | None:
    return getattr(handler, _DECLARED, None)


def of_request(request: web.Request) -> Access:
    return declared(request.match_info.handler) or DEFAULT


def check(request: web.Request, user: User) -> str | None:
    """None if the user may call this route, else the reason of the 401."""
    if not is_management(user):
        return NOT_MANAGEMENT
    rule = of_request(request).rule
    return None if rule.allows(request, user) else rule.reason


def _get(item: Any, path: Iterable[str]) -> Any:
    for part in path:
        if not isinstance(item, dict):
            return None
        item = item.get(part)
    return item


def visible(request: web.Request, items: list) -> list:
    """The items of a list response the request's user may see (the route's ListFilter)."""
    lists = of_request(request).lists
    user = request.get("user")
    if lists is None or user is None or lists.sees_all(user):
        return items
    allowed = lists.allowed(request, user)
    return [item for item in items if _get(item, lists.key) in allowed]
