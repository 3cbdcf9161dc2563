"""A device's identity lives with its data, so a restarted device is the same device."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

IDENTITY_FILE = "device.json"


def load_or_create(data: Path, name: str | None, profile: str) -> dict[str, Any]:
    path = data / IDENTITY_FILE
    if path.exists():
        identity = json.loads(path.read_text())
        if name and identity["name"] != name:
            identity["name"] = name
        identity["profile"] = profile
    else:
        identity = {
            "id": uuid.uuid4().hex,
            "name": name or data.name,
            "profile": profile,
            "created_at": time.time(),
        }
    data.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(identity, indent=2))
    tmp.replace(path)
    return identity
