"""Date normalisation: human-written dates to ISO `YYYY-MM-DD`.

The classic toy task for sequence-to-sequence models with attention: the
source is a date as people write it ("Tuesday, March 3rd 1998", "03/03/98",
"3.3.1998"), the target is its ISO form ("1998-03-03"). A model that learns
the task must look at the year digits to write the year, at the month name or
number to write the month and at the day to write the day, so the expected
alignment is known (`date_alignment`) and attention maps can be checked
against it.

Every source is unambiguous. Each numeric format has one fixed convention,
told apart by its separator:

- `/` is the US order month/day/year ("03/03/98", "3/3/1998"), except when
  the first field has four digits ("1998/03/03", year/month/day);
- `.` is the European order day.month.year ("3.3.1998", "03.03.1998");
- `-` with numbers only is ISO order year-month-day ("1998-3-3");
- eight digits with no separator are `YYYYMMDD` ("19980303").

Two-digit years ("98") are read in the window `[start_year, start_year + 99]`
and are only generated when the year range spans at most 100 years.
Weekday names, where present, are the true weekday of the date.
"""

import datetime
import re

import numpy as np

MONTHS = (
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
)
WEEKDAYS = (
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
)

# Month and weekday words the parser accepts, lowercase; "sept" is common
# enough in the wild to accept although the generator never writes it.
_MONTH_WORDS = {}
for _i, _name in enumerate(MONTHS):
    _MONTH_WORDS[_name.lower()] = _i + 1
    _MONTH_WORDS[_name[:3].lower()] = _i + 1
_MONTH_WORDS["sept"] = 9
_WEEKDAY_WORDS = set()
for _name in WEEKDAYS:
    _WEEKDAY_WORDS.add(_name.lower())
    _WEEKDAY_WORDS.add(_name[:3].lower())
_FILLER_WORDS = {"of", "the", "st", "nd", "rd", "th"}


def _ordinal(day):
    if day in (11, 12, 13):
        return f"{day}th"
    return f"{day}" + {1: "st", 2: "nd", 3: "rd"}.get(day % 10, "th")


def _fields(date):
    month = MONTHS[date.month - 1]
    weekday = WEEKDAYS[date.weekday()]
    return {
        "Y": f"{date.year:04d}",
        "yy": f"{date.year % 100:02d}",
        "m": f"{date.month}",
        "mm": f"{date.month:02d}",
        "d": f"{date.day}",
        "dd": f"{date.day:02d}",
        "do": _ordinal(date.day),
        "Month": month,
        "Mon": month[:3],
        "Weekday": weekday,
        "Wkd": weekday[:3],
    }


# name -> (template, has_words, uses_two_digit_year). Words get a random
# casing (as written, lower, upper); numeric formats have one spelling.
DATE_FORMATS = {
    "day_month_year": ("{d} {Month} {Y}", True, False),
    "month_day_comma_year": ("{Month} {d}, {Y}", True, False),
    "month_ordinal_comma_year": ("{Month} {do}, {Y}", True, False),
    "weekday_month_ordinal_year": ("{Weekday}, {Month} {do} {Y}", True, False),
    "weekday_day_month_year": ("{Weekday} {d} {Month} {Y}", True, False),
    "short_weekday_day_mon_year": ("{Wkd} {d} {Mon} {Y}", True, False),
    "mon_day_year": ("{Mon} {d} {Y}", True, False),
    "mon_dot_day_comma_short_year": ("{Mon}. {d}, '{yy}", True, True),
    "day_mon_short_year": ("{d} {Mon} {yy}", True, True),
    "ordinal_of_month_comma_year": ("{do} of {Month}, {Y}", True, False),
    "the_ordinal_of_month_year": ("the {do} of {Month} {Y}", True, False),
    "dd_dash_mon_dash_year": ("{dd}-{Mon}-{Y}", True, False),
    "us_slash_short": ("{mm}/{dd}/{yy}", False, True),
    "us_slash_long": ("{m}/{d}/{Y}", False, False),
    "iso_slash": ("{Y}/{mm}/{dd}", False, False),
    "european_dot": ("{d}.{m}.{Y}", False, False),
    "european_dot_padded": ("{dd}.{mm}.{Y}", False, False),
    "iso_unpadded": ("{Y}-{m}-{d}", False, False),
    "compact": ("{Y}{mm}{dd}", False, False),
}


def _check_years(start_year, end_year):
    if not isinstance(start_year, (int, np.integer)) or not 1 <= start_year:
        raise ValueError(
            "Received an invalid value for argument `start_year`, expected "
            f"an integer year >= 1. Received: start_year={start_year}"
        )
    if (
        not isinstance(end_year, (int, np.integer))
        or not start_year <= end_year <= 9999
    ):
        raise ValueError(
            "Received an invalid value for argument `end_year`, expected an "
            f"integer year in [start_year, 9999]. Received: end_year={end_year}"
        )


def _check_count(name, value):
    if not isinstance(value, (int, np.integer)) or value < 0:
        raise ValueError(
            f"Received an invalid value for argument `{name}`, expected a "
            f"non-negative integer. Received: {name}={value}"
        )


def _resolve_formats(formats, start_year, end_year):
    two_digit_ok = end_year - start_year < 100
    if formats is None:
        names = [
            name
            for name, (_, _, short) in DATE_FORMATS.items()
            if two_digit_ok or not short
        ]
        return names
    names = list(formats)
    for name in names:
        if name not in DATE_FORMATS:
            raise ValueError(
                "Received an invalid value for argument `formats`, expected "
                f"names from {sorted(DATE_FORMATS)}. "
                f"Received: formats={formats}"
            )
        if DATE_FORMATS[name][2] and not two_digit_ok:
            raise ValueError(
                f"Format {name!r} writes a two-digit year, which is ambiguous "
                "when the years span more than 100 years. Received: "
                f"formats={formats}, start_year={start_year}, "
                f"end_year={end_year}"
            )
    if not names:
        raise ValueError(
            "Received an invalid value for argument `formats`, expected at "
            f"least one format name. Received: formats={formats}"
        )
    return names


def format_date(date, format_name, case="as_is"):
    """Writes a `datetime.date` in one of the `DATE_FORMATS`.

    Args:
        date: a `datetime.date`.
        format_name: a key of `DATE_FORMATS`.
        case: `"as_is"`, `"lower"` or `"upper"`.

    Returns:
        The date as a string.

    Example:

    >>> format_date(datetime.date(1998, 3, 3), "weekday_month_ordinal_year")
    'Tuesday, March 3rd 1998'
    """
    if format_name not in DATE_FORMATS:
        raise ValueError(
            "Received an invalid value for argument `format_name`, expected "
            f"one of {sorted(DATE_FORMATS)}. "
            f"Received: format_name={format_name}"
        )
    text = DATE_FORMATS[format_name][0].format(**_fields(date))
    if case == "lower":
        return text.lower()
    if case == "upper":
        return text.upper()
    if case != "as_is":
        raise ValueError(
            "Received an invalid value for argument `case`, expected one of "
            f"'as_is', 'lower', 'upper'. Received: case={case}"
        )
    return text


def _ordinal_range(start_year, end_year):
    first = datetime.date(start_year, 1, 1).toordinal()
    last = datetime.date(end_year, 12, 31).toordinal()
    return first, last


def _generate(ordinals, rng, format_names):
    cases = ("as_is", "as_is", "lower", "upper")
    sources, targets = [], []
    format_ids = rng.integers(0, len(format_names), size=len(ordinals))
    case_ids = rng.integers(0, len(cases), size=len(ordinals))
    for ordinal, format_id, case_id in zip(ordinals, format_ids, case_ids):
        date = datetime.date.fromordinal(int(ordinal))
        name = format_names[format_id]
        case = cases[case_id] if DATE_FORMATS[name][1] else "as_is"
        sources.append(format_date(date, name, case))
        targets.append(date.isoformat())
    return sources, targets


def make_date_task(
    num_samples, seed=0, start_year=1950, end_year=2049, formats=None
):
    """Generates (human-written date, ISO date) pairs.

    Dates are drawn uniformly from the days between January 1st of
    `start_year` and December 31st of `end_year`; each is written in a format
    drawn uniformly from `formats`, and formats with words get a random
    casing (as written, lowercase or uppercase). The same arguments always
    give the same pairs.

    Args:
        num_samples: number of pairs.
        seed: seed of the generator.
        start_year: first year, inclusive.
        end_year: last year, inclusive.
        formats: optional list of `DATE_FORMATS` names; all by default
            (without the two-digit-year formats when the range spans more
            than 100 years).

    Returns:
        `(sources, targets)`: two lists of `num_samples` strings; targets
        are `YYYY-MM-DD`.

    Example:

    >>> sources, targets = make_date_task(3, seed=1)
    >>> all(len(t) == 10 for t in targets)
    True
    """
    _check_count("num_samples", num_samples)
    _check_years(start_year, end_year)
    format_names = _resolve_formats(formats, start_year, end_year)
    rng = np.random.default_rng(seed)
    first, last = _ordinal_range(start_year, end_year)
    ordinals = rng.integers(first, last + 1, size=num_samples)
    return _generate(ordinals, rng, format_names)


def split_date_task(
    num_train,
    num_val=0,
    num_test=0,
    seed=0,
    start_year=1950,
    end_year=2049,
    val_fraction=0.1,
    test_fraction=0.1,
    formats=None,
):
    """Generates train, validation and test date pairs on disjoint dates.

    The calendar days of the range are shuffled once (from `seed`) and cut
    into three disjoint pools (`1 - val_fraction - test_fraction`,
    `val_fraction`, `test_fraction` of the days); each split draws its dates
    from its own pool only, so held-out pairs are new dates, not only new
    spellings of dates seen in training.

    Args:
        num_train: number of training pairs.
        num_val: number of validation pairs.
        num_test: number of test pairs.
        seed: seed of the generator.
        start_year: first year, inclusive.
        end_year: last year, inclusive.
        val_fraction: share of the calendar days kept for validation.
        test_fraction: share of the calendar days kept for testing.
        formats: optional list of `DATE_FORMATS` names.

    Returns:
        A dict `{"train": (sources, targets), "val": ..., "test": ...}`.

    Example:

    >>> splits = split_date_task(100, num_val=10, num_test=10)
    >>> set(splits["train"][1]).isdisjoint(splits["test"][1])
    True
    """
    for name, value in (
        ("num_train", num_train),
        ("num_val", num_val),
        ("num_test", num_test),
    ):
        _check_count(name, value)
    _check_years(start_year, end_year)
    for name, value in (
        ("val_fraction", val_fraction),
        ("test_fraction", test_fraction),
    ):
        if not 0.0 <= value < 1.0:
            raise ValueError(
                f"Received an invalid value for argument `{name}`, expected "
                f"a float in [0, 1). Received: {name}={value}"
            )
    if val_fraction + test_fraction >= 1.0:
        raise ValueError(
            "Received invalid values for arguments `val_fraction` and "
            "`test_fraction`, expected a sum below 1. Received: "
            f"val_fraction={val_fraction}, test_fraction={test_fraction}"
        )
    format_names = _resolve_formats(formats, start_year, end_year)
    rng = np.random.default_rng(seed)
    first, last = _ordinal_range(start_year, end_year)
    days = rng.permutation(np.arange(first, last + 1))
    num_val_days = int(round(val_fraction * len(days)))
    num_test_days = int(round(test_fraction * len(days)))
    pools = {
        "val": days[:num_val_days],
        "test": days[num_val_days : num_val_days + num_test_days],
        "train": days[num_val_days + num_test_days :],
    }
    counts = {"train": num_train, "val": num_val, "test": num_test}
    splits = {}
    for split in ("train", "val", "test"):
        pool = pools[split]
        if counts[split] and not len(pool):
            raise ValueError(
                f"The {split} split has no calendar days to draw from; "
                "raise its fraction or the year range. Received: "
                f"val_fraction={val_fraction}, test_fraction={test_fraction}"
            )
        ordinals = pool[rng.integers(0, max(len(pool), 1), counts[split])]
        splits[split] = _generate(ordinals, rng, format_names)
    return splits


def _expand_two_digit_year(value, start_year):
    # The unique year in [start_year, start_year + 99] ending in `value`.
    return start_year + (value - start_year) % 100


def _parse_spans(source, start_year):
    """Returns `((year, month, day), (year_span, month_span, day_span))`."""
    text = source.strip()
    # Spans index `source`: the words and numbers are found in it, not in
    # the stripped text (leading spaces shifted every span before).
    lowered = source.lower()
    words = [
        m for m in re.finditer(r"[a-z]+", lowered) if m.group() not in
        _FILLER_WORDS and m.group() not in _WEEKDAY_WORDS
    ]
    numbers = list(re.finditer(r"\d+", lowered))

    def number(match):
        return int(match.group()), match.span()

    if words:
        # A month written as a word; the last number is the year and the
        # other number the day.
        if len(words) != 1 or words[0].group() not in _MONTH_WORDS:
            raise ValueError(f"Cannot read a date from {source!r}.")
        if len(numbers) != 2:
            raise ValueError(f"Cannot read a date from {source!r}.")
        month, month_span = _MONTH_WORDS[words[0].group()], words[0].span()
        day, day_span = number(numbers[0])
        year, year_span = number(numbers[1])
        if len(numbers[1].group()) == 2:
            year = _expand_two_digit_year(year, start_year)
        elif len(numbers[1].group()) != 4:
            raise ValueError(f"Cannot read a date from {source!r}.")
    elif re.fullmatch(r"\d{8}", text):
        offset = source.index(text)
        year, year_span = int(text[:4]), (offset, offset + 4)
        month, month_span = int(text[4:6]), (offset + 4, offset + 6)
        day, day_span = int(text[6:]), (offset + 6, offset + 8)
    else:
        match = re.fullmatch(r"\s*(\d+)([/.\-])(\d+)\2(\d+)\s*", source)
        if not match:
            raise ValueError(f"Cannot read a date from {source!r}.")
        separator = match.group(2)
        parts = [
            (int(match.group(i)), match.span(i), len(match.group(i)))
            for i in (1, 3, 4)
        ]
        if separator == "-" or (separator == "/" and parts[0][2] == 4):
            order = ("year", "month", "day")
        elif separator == "/":
            order = ("month", "day", "year")
        else:
            order = ("day", "month", "year")
        found = dict(zip(order, parts))
        year, year_span, year_len = found["year"]
        month, month_span, _ = found["month"]
        day, day_span, _ = found["day"]
        if year_len == 2:
            year = _expand_two_digit_year(year, start_year)
        elif year_len != 4:
            raise ValueError(f"Cannot read a date from {source!r}.")
    try:
        datetime.date(year, month, day)
    except ValueError:
        raise ValueError(
            f"{source!r} does not name a valid date "
            f"(year={year}, month={month}, day={day})."
        ) from None
    return (year, month, day), (year_span, month_span, day_span)


def parse_date(source, start_year=1950):
    """Reads a date written in one of the `DATE_FORMATS` back to ISO form.

    Args:
        source: the written date.
        start_year: first year of the window that two-digit years are read
            in (`[start_year, start_year + 99]`).

    Returns:
        The ISO string `YYYY-MM-DD`.

    Example:

    >>> parse_date("3rd of march, 1998")
    '1998-03-03'
    """
    (year, month, day), _ = _parse_spans(source, start_year)
    return datetime.date(year, month, day).isoformat()


def date_alignment(source, target=None, start_year=1950, as_matrix=False):
    """Which source characters determine each character of the ISO target.

    The year characters of the target (`YYYY`) come from the year in the
    source, the month characters (`MM`) from the month name or number, the
    day characters (`DD`) from the day number (without its ordinal suffix).
    The two dashes of the target depend on no source character.

    Args:
        source: the written date.
        target: optional ISO target; when given it must be the date that
            `source` names.
        start_year: first year of the window of two-digit years.
        as_matrix: return a float32 matrix instead of ranges.

    Returns:
        A list of 10 entries, one per target character: a `(start, stop)`
        range of source character indices, or `None` for the dashes. With
        `as_matrix=True`, a float32 array `(10, len(source))` with ones where
        a target character is determined by a source character; rows of the
        dashes are zero.

    Example:

    >>> date_alignment("3 March 1998")[:5]
    [(8, 12), (8, 12), (8, 12), (8, 12), None]
    """
    (year, month, day), spans = _parse_spans(source, start_year)
    iso = datetime.date(year, month, day).isoformat()
    if target is not None and target != iso:
        raise ValueError(
            f"The source {source!r} names {iso}, not the target {target!r}."
        )
    year_span, month_span, day_span = spans
    ranges = [year_span] * 4 + [None] + [month_span] * 2 + [None]
    ranges += [day_span] * 2
    if not as_matrix:
        return ranges
    matrix = np.zeros((len(ranges), len(source)), dtype="float32")
    for row, span in enumerate(ranges):
        if span is not None:
            matrix[row, span[0] : span[1]] = 1.0
    return matrix
