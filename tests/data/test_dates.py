"""The built-in translation task: the encoder reads a date as people write it, the decoder writes it as ISO.

The checks parse every generated string back with a parser written here from scratch (its own month and
weekday tables, its own two-digit-year rule), so a wrong weekday, a swapped day and month or an ambiguous
format fails even if the generator is consistently wrong.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from datetime import date

import pytest

from qkv.data.dates import (
    CASES,
    DATE_FORMATS,
    apply_case,
    date_pairs,
    english_ordinal,
    held_out_pairs,
    random_date_example,
    random_date_pair,
)

MONTHS = {
    name: number
    for number, names in enumerate(
        [
            "january jan janvier janv.",
            "february feb février févr.",
            "march mar mars",
            "april apr avril avr.",
            "may mai",
            "june jun juin",
            "july jul juillet juil.",
            "august aug août",
            "september sep septembre sept.",
            "october oct octobre oct.",
            "november nov novembre nov.",
            "december dec décembre déc.",
        ],
        start=1,
    )
    for name in names.split()
}
WEEKDAYS = {  # Monday is 0, as in date.weekday()
    name: number
    for number, names in enumerate(
        [
            "monday mon lundi lun.",
            "tuesday tue mardi mar.",
            "wednesday wed mercredi mer.",
            "thursday thu jeudi jeu.",
            "friday fri vendredi ven.",
            "saturday sat samedi sam.",
            "sunday sun dimanche dim.",
        ]
    )
    for name in names.split()
}
SUFFIXES = {1: "st", 2: "nd", 3: "rd", 21: "st", 22: "nd", 23: "rd", 31: "st"}


def full_year(digits: str) -> int:
    year = int(digits)
    if len(digits) == 4:
        return year
    return 2000 + year if year < 50 else 1900 + year


def parse(human: str) -> str:
    """The ISO date ``human`` means; fails on anything outside the documented conventions."""
    text = human.lower()
    if m := re.fullmatch(r"(\d{4})-(\d{2})-(\d{2})", text):
        return date(int(m[1]), int(m[2]), int(m[3])).isoformat()
    if m := re.fullmatch(r"(\d{2})/(\d{2})/(\d{4})|(\d{1,2})/(\d{1,2})/(\d{2})", text):  # month first
        month, day, year = (m[1], m[2], m[3]) if m[1] else (m[4], m[5], m[6])
        return date(full_year(year), int(month), int(day)).isoformat()
    if m := re.fullmatch(r"(\d{1,2})\.(\d{1,2})\.(\d{4})", text):  # day first
        return date(int(m[3]), int(m[2]), int(m[1])).isoformat()
    words = [w for w in text.replace(",", " ").split() if w not in ("the", "of", "le")]
    weekdays = [WEEKDAYS[w] for w in words if w in WEEKDAYS]
    months = [MONTHS[w] for w in words if w in MONTHS]
    numbers = [re.fullmatch(r"(\d+)(st|nd|rd|th|er)?", w) for w in words if w[0].isdigit()]
    assert len(months) == 1 and len(weekdays) <= 1 and len(numbers) == 2 and all(numbers), human
    assert len(words) == len(weekdays) + len(months) + len(numbers), f"unknown words in {human!r}"
    (day_match, year_match), day = numbers, int(numbers[0][1])
    if day_match[2] == "er":
        assert day == 1, human
    elif day_match[2]:
        assert day_match[2] == SUFFIXES.get(day, "th"), human
    assert len(year_match[1]) in (2, 4) and not year_match[2], human
    parsed = date(full_year(year_match[1]), months[0], day)
    if weekdays:
        assert weekdays[0] == parsed.weekday(), f"{human!r}: wrong weekday for {parsed}"
    return parsed.isoformat()


BY_NAME = {f.name: f for f in DATE_FORMATS}
HAND_WRITTEN = {  # 2021-03-01 is a Monday, 1999-12-23 a Thursday
    "en_weekday_d_month_yyyy": ("Monday, 1 March 2021", "Thursday, 23 December 1999"),
    "en_weekday_month_d_yyyy": ("Monday, March 1, 2021", "Thursday, December 23, 1999"),
    "en_month_d_yyyy": ("March 1, 2021", "December 23, 1999"),
    "en_d_month_yyyy": ("1 March 2021", "23 December 1999"),
    "en_d_mon_yyyy": ("1 Mar 2021", "23 Dec 1999"),
    "en_mon_d_yyyy": ("Mar 1, 2021", "Dec 23, 1999"),
    "en_wkd_mon_d_yyyy": ("Mon, Mar 1, 2021", "Thu, Dec 23, 1999"),
    "en_the_dth_of_month_yyyy": ("the 1st of March 2021", "the 23rd of December 1999"),
    "en_month_dth_yyyy": ("March 1st, 2021", "December 23rd, 1999"),
    "en_weekday_the_dth_of_month_yyyy": ("Monday the 1st of March, 2021", "Thursday the 23rd of December, 1999"),
    "en_d_mon_yy": ("1 Mar 21", "23 Dec 99"),
    "fr_d_mois_yyyy": ("1er mars 2021", "23 décembre 1999"),
    "fr_le_d_mois_yyyy": ("le 1er mars 2021", "le 23 décembre 1999"),
    "fr_jour_d_mois_yyyy": ("lundi 1er mars 2021", "jeudi 23 décembre 1999"),
    "fr_le_jour_d_mois_yyyy": ("le lundi 1er mars 2021", "le jeudi 23 décembre 1999"),
    "fr_d_mois_abr_yyyy": ("1er mars 2021", "23 déc. 1999"),
    "fr_jour_abr_d_mois_yyyy": ("lun. 1er mars 2021", "jeu. 23 décembre 1999"),
    "fr_d_mois_yy": ("1er mars 21", "23 décembre 99"),
    "us_mm/dd/yyyy": ("03/01/2021", "12/23/1999"),
    "us_m/d/yy": ("3/1/21", "12/23/99"),
    "eu_d.m.yyyy": ("1.3.2021", "23.12.1999"),
    "eu_dd.mm.yyyy": ("01.03.2021", "23.12.1999"),
    "iso_yyyy-mm-dd": ("2021-03-01", "1999-12-23"),
}


@pytest.mark.parametrize("name", sorted(HAND_WRITTEN))
def test_each_format_writes_the_hand_written_strings(name: str) -> None:
    fmt = BY_NAME[name]
    assert (fmt(date(2021, 3, 1)), fmt(date(1999, 12, 23))) == HAND_WRITTEN[name]
    assert parse(HAND_WRITTEN[name][0]) == "2021-03-01" and parse(HAND_WRITTEN[name][1]) == "1999-12-23"


def test_the_hand_written_table_covers_every_format() -> None:
    assert set(HAND_WRITTEN) == set(BY_NAME) and len(BY_NAME) == len(DATE_FORMATS)
    assert {f.language for f in DATE_FORMATS} == {"en", "fr", "numeric"}


def test_the_parser_rejects_what_it_should() -> None:  # the parser is only a check if it can fail
    wrong_ones = ("Tuesday, 1 March 2021", "2th of March 2021", "3/4/2021", "13/01/2021", "lundi 2 mars 2021")
    for wrong in (*wrong_ones, "2er mars 2021", "1 Mar 1921x"):
        with pytest.raises((AssertionError, ValueError)):
            parse(wrong)


def test_ordinals_and_cases() -> None:
    expected = {1: "1st", 2: "2nd", 3: "3rd", 4: "4th", 11: "11th", 12: "12th", 13: "13th", 21: "21st"}
    expected |= {22: "22nd", 23: "23rd", 24: "24th", 30: "30th", 31: "31st", 111: "111th", 101: "101st"}
    assert {day: english_ordinal(day) for day in expected} == expected
    assert apply_case("le 1er mars 2021", "title") == "Le 1er Mars 2021"  # not str.title()'s "1Er"
    assert apply_case("the 3rd of March", "upper") == "THE 3RD OF MARCH"
    assert apply_case("Mon, Mar 1", "lower") == "mon, mar 1"
    assert apply_case("Mon, Mar 1", "as written") == "Mon, Mar 1"


@pytest.fixture(scope="module")
def examples() -> list:
    rng = random.Random(0)
    return [random_date_example(rng) for _ in range(20_000)]


def test_every_generated_string_parses_back_to_its_iso_target(examples: list) -> None:
    for example in examples:
        assert date.fromisoformat(example.iso) == date(*map(int, example.iso.split("-")))
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", example.iso)
        assert parse(example.human) == example.iso, example


def test_every_format_case_and_language_appears(examples: list) -> None:
    formats = Counter(e.format.name for e in examples)
    assert set(formats) == set(BY_NAME) and min(formats.values()) > 300
    assert set(Counter(e.case for e in examples)) == set(CASES)
    languages = Counter(e.format.language for e in examples)
    assert languages["en"] > 5000 and languages["fr"] > 5000 and languages["numeric"] > 3000
    words = Counter(w for e in examples for w in e.human.lower().split())
    assert words["mars"] > 100 and words["march"] > 100 and words["lundi"] > 50 and words["monday"] > 50


def test_dates_cover_the_range_and_two_digit_years_only_where_they_map_back(examples: list) -> None:
    years = [int(e.iso[:4]) for e in examples]
    assert 1900 <= min(years) < 1905 and 2095 < max(years) <= 2099
    assert all(1950 <= int(e.iso[:4]) <= 2049 for e in examples if e.format.two_digit_year)
    assert {f.name for f in DATE_FORMATS if f.two_digit_year} == {"en_d_mon_yy", "fr_d_mois_yy", "us_m/d/yy"}
    for fmt in DATE_FORMATS:
        assert fmt.can_write(date(1950, 1, 1)) and fmt.can_write(date(2049, 12, 31))
        if fmt.two_digit_year:
            assert not fmt.can_write(date(1949, 12, 31)) and not fmt.can_write(date(2050, 1, 1))
            with pytest.raises(ValueError, match="cannot write"):
                fmt(date(1900, 5, 5))


def test_no_human_string_means_two_dates(examples: list) -> None:
    meaning: dict[str, str] = {}
    for example in examples:
        assert meaning.setdefault(example.human, example.iso) == example.iso, example.human
    # The risky spots, written out: day/month order around the 12th, two-digit years at the 1950/2049 edge.
    for day in (date(2003, 4, 5), date(2003, 5, 4), date(1950, 1, 2), date(2049, 12, 31), date(1999, 11, 12)):
        for fmt in DATE_FORMATS:
            for case in CASES:
                assert parse(apply_case(fmt(day), case)) == day.isoformat()


def test_pairs_are_deterministic_and_named() -> None:
    corpus = date_pairs(200, seed=5)
    assert corpus.name == "dates" and len(corpus) == 200
    assert date_pairs(200, seed=5).sources == corpus.sources
    assert date_pairs(200, seed=6).sources != corpus.sources
    rng = random.Random(5)
    assert list(zip(corpus.sources, corpus.targets, strict=True)) == [random_date_pair(rng) for _ in range(200)]


def test_held_out_pairs_come_from_another_stream() -> None:
    train = date_pairs(2000, seed=0)
    held = held_out_pairs(2000, seed=0)
    assert held.name == "dates" and held_out_pairs(2000, seed=0).sources == held.sources
    assert len(set(held.sources) & set(train.sources)) < 20  # chance overlaps only, not the same stream
    assert held.sources[:50] != train.sources[:50]
    for seed in range(3):  # the held-out stream is none of the first training streams
        assert held_out_pairs(50, seed=seed).sources != date_pairs(50, seed=seed).sources
    fresh = held_out_pairs(2000, seed=0, exclude=train.sources)
    assert not set(fresh.sources) & set(train.sources) and len(fresh) == 2000
    assert all(parse(h) == iso for h, iso in zip(fresh.sources, fresh.targets, strict=True))
