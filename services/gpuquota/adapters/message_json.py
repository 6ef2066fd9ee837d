"""A message's wire JSON, encoded once while the message is recent (or taken from where it was read).

The distributed scheduler records each event in the log (``log_codec.encode_events``) and publishes it
to ``gpuquota.job-state`` (``kafka.encode``) moments later: encoding it twice cost about 2.5 % of the
scheduler at 1,000 jobs/s (py-spy). Messages are frozen, so the JSON of one object never changes; the
memo holds the object itself, so an id is never taken for another object's while it is remembered.

The memo is an ``OrderedDict``: forgetting the oldest entry of a plain ``dict`` (``del
d[next(iter(d))]``) walks past every slot freed since the dict was last compacted, up to a thousand
here, which made this memo 3 to 5 % of the scheduler's CPU at 2,000 jobs/s (py-spy); ``popitem(last=
False)`` unlinks it at once. The text is ``model_dump_json()``'s, from the serializer that method
calls, without the Python layer that passes on its sixteen default arguments (a fifth of the time).
"""

from __future__ import annotations

from collections import OrderedDict

from gpuquota.wire.base import Message

RECENT = 4096
"""Messages remembered (first in, first out): more than a batch's events."""

_recent: OrderedDict[int, tuple[Message, str]] = OrderedDict()


def message_json(message: Message) -> str:
    """``message.model_dump_json()``, from the memo when this very object was encoded lately."""
    hit = _recent.get(id(message))
    if hit is not None and hit[0] is message:
        return hit[1]
    text = message.__pydantic_serializer__.to_json(message).decode()  # = model_dump_json(): see below
    remember(message, text)
    return text


def remember(message: Message, text: str) -> None:
    """``text`` is ``message``'s JSON from now on: its encoding, or the text it was decoded from.

    The scheduler decodes each input from a Kafka record and stores it in the log moments later:
    the record's own JSON reads back equal to the message (it was validated into it), and the log
    keeps it as ``jsonb``, so encoding it again only cost CPU (about 4 % of the scheduler's).
    """
    _recent[id(message)] = (message, text)
    if len(_recent) > RECENT:
        _recent.popitem(last=False)
