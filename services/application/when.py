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

from engram_ledger.services.application.terms import sparse_query

_MONTH = (
    r"(?:jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?|sep(?:t(?:ember)?)?"
    r"|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)"
)
_ORDINAL = r"\d{1,2}(?:st|nd|rd|th)?"
_PHRASE = re.compile(
    r"\b(?:19|20)\d\d-\d\d-\d\d\b"
    rf"|\b(?:{_ORDINAL}\s+(?:of\s+)?)?{_MONTH}\b\.?(?:\s+{_ORDINAL}\b)?(?:,?\s+(?:19|20)\d\d\b)?"
    r"|\b(?:19|20)\d\d\b"
    r"|\b(?:yesterday|today|(?:last|this|past)\s+(?:week|weekend|month|year)|\d+\s+(?:days?|weeks?|months?|years?)\s+ago"
    r"|an?\s+(?:week|month|year)\s+ago)\b",
    re.I,
)
_MONTH_ONLY = re.compile(rf"^{_MONTH}\.?$", re.I)
_YEAR = re.compile(r"\b(?:19|20)\d\d\b")
_RELATIVE = re.compile(r"\b(?:ago|last|this|past)\b", re.I)
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
        # A time recorded without a zone is read as UTC, as the service writes times.
        return self.start <= (at if at.tzinfo is not None else at.replace(tzinfo=UTC)) < self.end

    def overlaps(self, start: datetime | None, end: datetime | None) -> bool:
        """Whether a span of time [start, end) (None: open on that side) meets the period (a
        month of any year: the span's bounds fall in that month, or it is open)."""
        if self.start is None or self.end is None:
            return any(b is not None and b.month == self.month for b in (start, end)) or (start is None and end is None)
        return (start is None or start < self.end) and (end is None or self.start < end)


def asked_period(query: str, now: datetime) -> Period | None:
    """The time the query names, as a period; several ("between March and May 2023"): from
    the first's start to the last's end; None when it names none."""
    periods = []
    for found in _PHRASE.finditer(query):
        text = found.group(0)
        if _MONTH_ONLY.match(text) and not _LEAD.search(query[: found.start()]):
            continue
        read = _read(text, now)
        if read is not None:
            periods.append(read)
    dated = [p for p in periods if p.start is not None and p.end is not None]
    if len(dated) > 1:
        return Period(min(p.start for p in dated if p.start), max(p.end for p in dated if p.end))
    return dated[0] if dated else (periods[0] if periods else None)


# Words a question about a time asks with, which say nothing of what it asks about.
_ABOUT_NOTHING = re.compile(
    r"\b(?:happen(?:ed|s|ing)?|do|does|did|doing|done|go|goes|went|going|gone|was|were|be|been|up\s+to)\b", re.I
)


def time_only(query: str) -> bool:
    """Whether the query asks about a time and nothing else ("what did I do in May 2023?",
    "what happened last week?"): no BM25 term is left once its times and its "did", "happen"
    and the like are out."""
    rest = _ABOUT_NOTHING.sub(" ", _PHRASE.sub(" ", query))
    return _PHRASE.search(query) is not None and not sparse_query(rest).indices


def warm_time_phrases() -> None:
    """Load what reading a time phrase needs (its language data, its patterns) ahead of the
    first search that names a time."""
    asked_period("what did I do in May 2023, or last week?", datetime.now(UTC))


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
        # A month named without a year is that month of any year; "last month", "2 months ago"
        # are one month.
        if not _YEAR.search(text) and not _RELATIVE.search(text):
            return Period(month=at.month)
        start = datetime(at.year, at.month, 1, tzinfo=UTC)
        return Period(start, datetime(at.year + (at.month == 12), at.month % 12 + 1, 1, tzinfo=UTC))
    day = datetime(at.year, at.month, at.day, tzinfo=UTC)
    if period == "week":
        # The calendar week (from Monday) the phrase falls in: "this week" is this one so far.
        monday = day - timedelta(days=day.weekday())
        return Period(monday, monday + timedelta(days=7))
    return Period(day - DAY_BEFORE, day + DAY_AFTER)
