"""An `acs-sms` item's payload: the ACS SMS send body, checked where the item is enqueued.

The payload is the body of `POST {endpoint}/sms` without the per-recipient repeatability fields,
which the provider sets itself: `{"from": "+18005550100", "smsRecipients": [{"to": "+15550100"}],
"message": "...", "smsSendOptions": {"enableDeliveryReport": true}}`. What ACS would refuse for
every attempt (a number that is not E.164, more than 100 recipients) is refused at enqueue, so it
is a 422 to the caller rather than a failed delivery.
"""

from __future__ import annotations

import re
from typing import Any

# The ACS SMS provider kind; its destinations' payloads are checked here.
ACS_SMS = "acs-sms"
# ACS's limit on recipients of one send request.
MAX_SMS_RECIPIENTS = 100
# ACS's limit on a message's length, in characters.
MAX_SMS_MESSAGE = 2048
# E.164: a '+', a country code that does not start with 0, at most 15 digits in all.
_E164 = re.compile(r"\+[1-9][0-9]{1,14}")
# Fields of a recipient the provider sets (`activities/providers/acs_sms.py`): a caller's own
# would break the per-recipient repeatability the provider promises.
PROVIDER_RECIPIENT_FIELDS = ("repeatabilityRequestId", "repeatabilityFirstSent")
# The send option the provider sets to the item's message id: delivery reports carry it back,
# and it is how a report finds its item.
PROVIDER_TAG = "tag"


def is_e164(number: object) -> bool:
    """Whether `number` is a phone number in E.164 form (`+` and 2 to 15 digits)."""
    return isinstance(number, str) and _E164.fullmatch(number) is not None


def sms_recipients(payload: dict[str, Any]) -> list[str]:
    """The `to` numbers of a checked payload, in order."""
    return [str(recipient["to"]) for recipient in payload["smsRecipients"]]


def check_sms_payload(payload: dict[str, Any]) -> None:
    """Refuse (ValueError naming the field) an SMS payload ACS would refuse on every attempt."""
    if not is_e164(payload.get("from")):
        raise ValueError("payload.from must be the sender's phone number in E.164 (+15550100)")
    message = payload.get("message")
    if not isinstance(message, str) or not message:
        raise ValueError("payload.message must be a non-empty string")
    if len(message) > MAX_SMS_MESSAGE:
        raise ValueError(f"payload.message is longer than {MAX_SMS_MESSAGE} characters")
    recipients = payload.get("smsRecipients")
    if not isinstance(recipients, list) or not recipients:
        raise ValueError('payload.smsRecipients must be a non-empty array of {"to": number}')
    if len(recipients) > MAX_SMS_RECIPIENTS:
        raise ValueError(
            f"payload.smsRecipients has {len(recipients)} recipients; ACS takes at most"
            f" {MAX_SMS_RECIPIENTS} in one request"
        )
    seen: set[str] = set()
    for index, recipient in enumerate(recipients):
        where = f"payload.smsRecipients[{index}]"
        if not isinstance(recipient, dict):
            raise ValueError(f'{where} must be an object {{"to": number}}')
        number = recipient.get("to")
        if not is_e164(number):
            raise ValueError(f"{where}.to: {number!r} is not a phone number in E.164 (+15550100)")
        if number in seen:
            raise ValueError(f"{where}.to: {number} is listed twice")
        seen.add(str(number))
        unexpected = sorted(set(recipient) - {"to"})
        if unexpected:
            raise ValueError(
                f"{where}: {', '.join(unexpected)}: not allowed (the provider sets each"
                " recipient's repeatability fields)"
            )
    options = payload.get("smsSendOptions")
    if options is not None:
        if not isinstance(options, dict):
            raise ValueError("payload.smsSendOptions must be an object")
        report = options.get("enableDeliveryReport")
        if report is not None and not isinstance(report, bool):
            raise ValueError("payload.smsSendOptions.enableDeliveryReport must be a boolean")
        if PROVIDER_TAG in options:
            raise ValueError(
                f"payload.smsSendOptions.{PROVIDER_TAG}: not allowed (the provider sets it to the"
                " item's message id, which delivery reports carry back)"
            )
    unexpected = sorted(set(payload) - {"from", "message", "smsRecipients", "smsSendOptions"})
    if unexpected:
        raise ValueError(f"payload: {', '.join(unexpected)}: not a field of an ACS SMS send")
