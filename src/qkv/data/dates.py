"""The built-in translation task: dates as people write them ─▶ ISO dates. No download needed.

The sources' encoder-decoder translates a sentence of one language into another (English to French): the
encoder reads the source sentence, the decoder writes the target one token at a time from ``<bos>``,
looking at the encoder's output through cross-attention. Real parallel corpora take hours to learn on a
CPU; this task has the same shape and is learned in minutes::

    source (human)                     target (ISO 8601)
    Wednesday, 3 March 2021       ─▶   2021-03-03
    le 1er mars 2021              ─▶   2021-03-01
    MAR 3, 2021                   ─▶   2021-03-03
    3/3/21                        ─▶   2021-03-03

Dates are drawn uniformly from 1900-01-01 to 2099-12-31 and written in one of :data:`DATE_FORMATS`
(English, French, or numeric), then in one of four cases: as written, lower, UPPER or Capitalised Words.
Weekday names come from :mod:`datetime`, so they are always the right day for the date.

Every human string means exactly one date; the conventions that make it so:

- slashes are US order, month first: ``03/03/2021`` is MM/DD/YYYY and ``3/4/21`` is 4 March (M/D/YY);
- dots are European order, day first: ``4.3.2021`` and ``04.03.2021`` are 4 March (D.M.YYYY);
- a dash-separated date is ISO, year first: ``2021-03-04``. (So there is no French ``04/03/2021``.)
- two-digit years: 00-49 mean 2000-2049 and 50-99 mean 1950-1999. Formats with a two-digit year are only
  used for years 1950-2049, where the rule gives the year back; other dates use the other formats.
"""

from __future__ import annotations

import random
from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import date
from typing import Literal, NamedTuple

from qkv.data.parallel import ParallelCorpus

FIRST_DATE = date(1900, 1, 1)
LAST_DATE = date(2099, 12, 31)
TWO_DIGIT_YEARS = range(1950, 2050)
"""The years a two-digit year can stand for: ``yy`` 00-49 is 20yy, 50-99 is 19yy."""

EN_MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
             "November", "December")  # fmt: skip
EN_MONTHS_ABBR = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
EN_WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
EN_WEEKDAYS_ABBR = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
FR_MONTHS = ("janvier", "février", "mars", "avril", "mai", "juin", "juillet", "août", "septembre", "octobre",
             "novembre", "décembre")  # fmt: skip
FR_MONTHS_ABBR = ("janv.", "févr.", "mars", "avr.", "mai", "juin", "juil.", "août", "sept.", "oct.", "nov.", "déc.")
FR_WEEKDAYS = ("lundi", "mardi", "mercredi", "jeudi", "vendredi", "samedi", "dimanche")
FR_WEEKDAYS_ABBR = ("lun.", "mar.", "mer.", "jeu.", "ven.", "sam.", "dim.")

Case = Literal["as written", "lower", "upper", "title"]
CASES: tuple[Case, ...] = ("as written", "lower", "upper", "title")
CASE_WEIGHTS = (0.55, 0.15, 0.15, 0.15)
"""How often each case is drawn; "title" capitalises the first letter of every word ("Le 1er Mars 2021")."""

HELD_OUT_STREAM = "qkv.data.dates held-out"
"""Prefix of the seed behind :func:`held_out_pairs`, so its dates never come from :func:`date_pairs`'s stream."""


def english_ordinal(day: int) -> str:
    """1st, 2nd, 3rd, 4th, ..., 11th, 12th, 13th, ..., 21st, 22nd, 23rd, ..., 31st."""
    suffix = "th" if 11 <= day % 100 <= 13 else {1: "st", 2: "nd", 3: "rd"}.get(day % 10, "th")
    return f"{day}{suffix}"


def french_day(day: int) -> str:
    """French writes the first of the month as an ordinal, "1er" (premier), and other days as numbers."""
    return "1er" if day == 1 else str(day)


def date_fields(day: date) -> dict[str, str]:
    """The pieces a :class:`DateFormat` template can use, for one date."""
    month, weekday = day.month - 1, day.weekday()  # weekday(): Monday is 0
    return {
        "d": str(day.day),
        "dd": f"{day.day:02d}",
        "dth": english_ordinal(day.day),
        "d_fr": french_day(day.day),
        "m": str(day.month),
        "mm": f"{day.month:02d}",
        "yyyy": f"{day.year:04d}",
        "yy": f"{day.year % 100:02d}",
        "Month": EN_MONTHS[month],
        "Mon": EN_MONTHS_ABBR[month],
        "Weekday": EN_WEEKDAYS[weekday],
        "Wkd": EN_WEEKDAYS_ABBR[weekday],
        "mois": FR_MONTHS[month],
        "mois_abr": FR_MONTHS_ABBR[month],
        "jour": FR_WEEKDAYS[weekday],
        "jour_abr": FR_WEEKDAYS_ABBR[weekday],
    }


@dataclass(frozen=True)
class DateFormat:
    """One way of writing a date: a ``str.format`` template over :func:`date_fields`.

    ``language`` is "en", "fr" or "numeric"; ``two_digit_year`` marks templates that use ``{yy}`` and so
    can only write years in :data:`TWO_DIGIT_YEARS`. Call the format on a date to write it.
    """

    name: str
    language: Literal["en", "fr", "numeric"]
    template: str
    two_digit_year: bool = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "two_digit_year", "{yy}" in self.template)

    def can_write(self, day: date) -> bool:
        return FIRST_DATE <= day <= LAST_DATE and (not self.two_digit_year or day.year in TWO_DIGIT_YEARS)

    def __call__(self, day: date) -> str:
        if not self.can_write(day):
            raise ValueError(f"format {self.name} cannot write {day.isoformat()} unambiguously")
        return self.template.format(**date_fields(day))


DATE_FORMATS: list[DateFormat] = [
    # English                                                          e.g. for 2021-03-03
    DateFormat("en_weekday_d_month_yyyy", "en", "{Weekday}, {d} {Month} {yyyy}"),  # Wednesday, 3 March 2021
    DateFormat("en_weekday_month_d_yyyy", "en", "{Weekday}, {Month} {d}, {yyyy}"),  # Wednesday, March 3, 2021
    DateFormat("en_month_d_yyyy", "en", "{Month} {d}, {yyyy}"),  # March 3, 2021
    DateFormat("en_d_month_yyyy", "en", "{d} {Month} {yyyy}"),  # 3 March 2021
    DateFormat("en_d_mon_yyyy", "en", "{d} {Mon} {yyyy}"),  # 3 Mar 2021
    DateFormat("en_mon_d_yyyy", "en", "{Mon} {d}, {yyyy}"),  # Mar 3, 2021
    DateFormat("en_wkd_mon_d_yyyy", "en", "{Wkd}, {Mon} {d}, {yyyy}"),  # Wed, Mar 3, 2021
    DateFormat("en_the_dth_of_month_yyyy", "en", "the {dth} of {Month} {yyyy}"),  # the 3rd of March 2021
    DateFormat("en_month_dth_yyyy", "en", "{Month} {dth}, {yyyy}"),  # March 3rd, 2021
    DateFormat("en_weekday_the_dth_of_month_yyyy", "en", "{Weekday} the {dth} of {Month}, {yyyy}"),
    DateFormat("en_d_mon_yy", "en", "{d} {Mon} {yy}"),  # 3 Mar 21
    # French
    DateFormat("fr_d_mois_yyyy", "fr", "{d_fr} {mois} {yyyy}"),  # 3 mars 2021, 1er mars 2021
    DateFormat("fr_le_d_mois_yyyy", "fr", "le {d_fr} {mois} {yyyy}"),  # le 3 mars 2021
    DateFormat("fr_jour_d_mois_yyyy", "fr", "{jour} {d_fr} {mois} {yyyy}"),  # mercredi 3 mars 2021
    DateFormat("fr_le_jour_d_mois_yyyy", "fr", "le {jour} {d_fr} {mois} {yyyy}"),  # le mercredi 3 mars 2021
    DateFormat("fr_d_mois_abr_yyyy", "fr", "{d_fr} {mois_abr} {yyyy}"),  # 3 janv. 2021
    DateFormat("fr_jour_abr_d_mois_yyyy", "fr", "{jour_abr} {d_fr} {mois} {yyyy}"),  # mer. 3 mars 2021
    DateFormat("fr_d_mois_yy", "fr", "{d_fr} {mois} {yy}"),  # 3 mars 21
    # Numeric: slashes are month first (US), dots are day first (European), dashes are ISO
    DateFormat("us_mm/dd/yyyy", "numeric", "{mm}/{dd}/{yyyy}"),  # 03/03/2021
    DateFormat("us_m/d/yy", "numeric", "{m}/{d}/{yy}"),  # 3/3/21
    DateFormat("eu_d.m.yyyy", "numeric", "{d}.{m}.{yyyy}"),  # 3.3.2021
    DateFormat("eu_dd.mm.yyyy", "numeric", "{dd}.{mm}.{yyyy}"),  # 03.03.2021
    DateFormat("iso_yyyy-mm-dd", "numeric", "{yyyy}-{mm}-{dd}"),  # 2021-03-03
]
"""Every way the task writes a date; the comments show 2021-03-03, a Wednesday."""


def apply_case(text: str, case: Case) -> str:
    """Write ``text`` as written, in lower case, in UPPER case, or with Every Word Capitalised."""
    if case == "lower":
        return text.lower()
    if case == "upper":
        return text.upper()
    if case == "title":  # not str.title(), which would write "1Er" and "3Rd"
        return " ".join(word[:1].upper() + word[1:] for word in text.split(" "))
    return text


def random_date(rng: random.Random) -> date:
    """A date drawn uniformly from :data:`FIRST_DATE` to :data:`LAST_DATE`."""
    return date.fromordinal(rng.randint(FIRST_DATE.toordinal(), LAST_DATE.toordinal()))


class DateExample(NamedTuple):
    """One generated pair with how it was made: ``human`` ─▶ ``iso``, written by ``format`` in ``case``."""

    human: str
    iso: str
    format: DateFormat
    case: Case


def random_date_example(rng: random.Random) -> DateExample:
    """A uniform random date, written in a random format that can write it (see :data:`TWO_DIGIT_YEARS`)
    and a random case, with the same date as ``YYYY-MM-DD``."""
    day = random_date(rng)
    fmt = rng.choice([f for f in DATE_FORMATS if f.can_write(day)])
    case = rng.choices(CASES, weights=CASE_WEIGHTS)[0]
    return DateExample(apply_case(fmt(day), case), day.isoformat(), fmt, case)


def random_date_pair(rng: random.Random) -> tuple[str, str]:
    """One ``(human, iso)`` pair, e.g. ``("le 1er mars 2021", "2021-03-01")``: :func:`random_date_example`
    without the bookkeeping."""
    example = random_date_example(rng)
    return example.human, example.iso


def date_pairs(n: int, seed: int = 0) -> ParallelCorpus:
    """``n`` random date pairs from ``random.Random(seed)``: the training data of the task (name "dates")."""
    rng = random.Random(seed)
    pairs = [random_date_pair(rng) for _ in range(n)]
    return ParallelCorpus(
        sources=[human for human, _ in pairs],
        targets=[iso for _, iso in pairs],
        name="dates",
        source=f"qkv.data.dates: {n} generated pairs, seed {seed}",
    )


def held_out_pairs(n: int, seed: int = 0, *, exclude: Collection[str] = ()) -> ParallelCorpus:
    """``n`` fresh date pairs for the exact-match test, from a seed stream :func:`date_pairs` never uses.

    Pairs whose human string is in ``exclude`` (e.g. ``train.sources``) are drawn again, so a model is
    scored only on strings it has not seen.
    """
    rng = random.Random(f"{HELD_OUT_STREAM} {seed}")  # a string seed: a stream no integer seed gives
    excluded = exclude if isinstance(exclude, set | frozenset) else set(exclude)
    sources: list[str] = []
    targets: list[str] = []
    while len(sources) < n:
        human, iso = random_date_pair(rng)
        if human not in excluded:
            sources.append(human)
            targets.append(iso)
    return ParallelCorpus(sources, targets, name="dates", source=f"qkv.data.dates: {n} held-out pairs, seed {seed}")
