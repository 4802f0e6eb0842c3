"""The Event the client writes on an object: its body, built here and sent by
`toolkit.kube.Client.event` (and `warn`, for a Warning).

An Event names the object it is about as read from the server (apiVersion,
kind, name, namespace and uid), so a report is never attached to a later
object of the same name. It is a core/v1 Event with both the old fields
(`source`, `firstTimestamp`, `count`) and the new ones
(`reportingComponent`, `reportingInstance`), so `kubectl describe` and
`kubectl events` show it alike; the instance is the pod's name ($HOSTNAME),
else the component. The message is cut at 1024 characters: a flag's causes
can be longer, and they are kept whole on the object itself. Nothing here
sends anything.
"""

from __future__ import annotations

import os
from typing import Any

from toolkit import detect

Obj = dict[str, Any]
MESSAGE_LIMIT = 1024


def body(*, involved: Obj, reason: str, message: str, component: str, type_: str) -> Obj:
    """An Event of `type_` (Normal or Warning) on `involved`, stamped now, named after it
    (`generateName`), in its namespace."""
    meta = involved["metadata"]
    now = detect.now()
    return {
        "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
        "involvedObject": {
            "apiVersion": involved.get("apiVersion"),
            "kind": involved.get("kind"),
            "name": meta["name"],
            "namespace": meta["namespace"],
            "uid": meta.get("uid"),
        },
        "type": type_,
        "reason": reason,
        "message": message[:MESSAGE_LIMIT],
        "source": {"component": component},
        "reportingComponent": component,
        "reportingInstance": os.environ.get("HOSTNAME", component),
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }
