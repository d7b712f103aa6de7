"""When a search query asks about: the dates and times it names, as a period. A pattern finds
the phrases that name a time (a month with its day or year, a year, "yesterday", "last week",
"3 days ago"); ``dateparser`` reads each (English, relative times from the query's now) and says
how precise it is. "in October 2023" is that month, "on May 3, 2023" that day and the week after
it (people tell of a day's events in the days that follow), "in 2023" that year, "last week" the
seven days from a week ago; a month without a year ("in June", "last May") is that month of any
year. A month's name alone with no preposition before it is not a date ("May I ask ...?"). The
search lifts what happened within the period (``ranking.boost_period``)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

_MONTH = (
    r"(?:jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?|sep(?:t(?:ember)?)?"
    r"|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)"
)
_ORDINAL = r"\d{1,2}(?:st|nd|rd|th)?"
_PHRASE = re.compile(
    rf"\b(?:{_ORDINAL}\s+(?:of\s+)?)?{_MONTH}\b\.?(?:\s+{_ORDINAL}\b)?(?:,?\s+(?:19|20)\d\d\b)?"
    r"|\b(?:19|20)\d\d\b"
    r"|\b(?:yesterday|today|(?:last|this|past)\s+(?:week|weekend|month|year)|\d+\s+(?:days?|weeks?|months?|years?)\s+ago"
    r"|an?\s+(?:week|month|year)\s+ago)\b",
    re.I,
)
_MONTH_ONLY = re.compile(rf"^{_MONTH}\.?$", re.I)
_YEAR = re.compile(r"\b(?:19|20)\d\d\b")
# Before a month's name alone: what makes it a date, not a verb or a name.
_LEAD = re.compile(r"\b(?:in|on|during|since|until|till|by|of|from|last|this|next|early|late|mid|around)\s+$", re.I)
# The day named, and the week after it.
DAY_BEFORE = timedelta(days=1)
DAY_AFTER = timedelta(days=8)


@dataclass(frozen=True)
class Period:
    """[start, end), or ``month`` of any year when ``start`` is None."""

    start: datetime | None = None
    end: datetime | None = None
    month: int | None = None

    def holds(self, at: datetime) -> bool:
        if self.start is None or self.end is None:
            return at.month == self.month
        return self.start <= at < self.end


def asked_period(query: str, now: datetime) -> Period | None:
    """The first time the query names, as a period; None when it names none."""
    for found in _PHRASE.finditer(query):
        text = found.group(0)
        if _MONTH_ONLY.match(text) and not _LEAD.search(query[: found.start()]):
            continue
        read = _read(text, now)
        if read is not None:
            return read
    return None


def without_times(query: str) -> str:
    """The query without the phrases that name a time: what else it asks about."""
    return _PHRASE.sub(" ", query)


def _read(text: str, now: datetime) -> Period | None:
    # Imported on first use: dateparser loads its language data when imported.
    from dateparser.date import DateDataParser

    base = now.astimezone(UTC).replace(tzinfo=None)
    settings: dict[str, Any] = {"RELATIVE_BASE": base, "PREFER_DATES_FROM": "past"}
    data = DateDataParser(languages=["en"], settings=settings).get_date_data(text)
    if data.date_obj is None:
        return None
    at, period = data.date_obj, data.period or "day"
    if period == "year":
        return Period(datetime(at.year, 1, 1, tzinfo=UTC), datetime(at.year + 1, 1, 1, tzinfo=UTC))
    if period == "month":
        if not _YEAR.search(text) and not re.search(r"\b(?:last|this|past)\s+month\b", text, re.I):
            return Period(month=at.month)
        start = datetime(at.year, at.month, 1, tzinfo=UTC)
        return Period(start, datetime(at.year + (at.month == 12), at.month % 12 + 1, 1, tzinfo=UTC))
    day = datetime(at.year, at.month, at.day, tzinfo=UTC)
    if period == "week":
        return Period(day, day + timedelta(days=7))
    return Period(day - DAY_BEFORE, day + DAY_AFTER)
