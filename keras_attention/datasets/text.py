"""Binary sentiment sentences with negation and distractors.

A small generated text-classification task where the class is decided by a
few known tokens, so attention pooling can be checked: every sentence holds
exactly one sentiment adjective ("good", "awful", ...), optionally negated by
"not" or "never" right before it ("not good" is negative, "never bad" is
positive), and optionally wrapped in "it is not true that ..." which flips
the class once more (double negation). All other tokens are distractors:
neutral words, places, names and objects that say nothing about the class.

Tokens are lowercase words separated by single spaces, so
`sentence.split(" ")` gives the tokens that the key positions index.
"""

import numpy as np

POSITIVE_WORDS = (
    "good",
    "great",
    "excellent",
    "wonderful",
    "fantastic",
    "enjoyable",
    "brilliant",
    "lovely",
    "superb",
    "pleasant",
)
NEGATIVE_WORDS = (
    "bad",
    "terrible",
    "awful",
    "boring",
    "dull",
    "poor",
    "horrible",
    "dreadful",
    "disappointing",
    "weak",
)
NEGATION_WORDS = ("not", "never")
_SUBJECTS = (
    "the movie",
    "the film",
    "the book",
    "the concert",
    "the meal",
    "the trip",
    "the show",
    "the game",
    "the album",
    "the hotel",
)
_VERBS = ("was", "is", "seemed", "felt")
# "felt never good" reads badly; negations follow a plain copula.
_NEGATABLE_VERBS = ("was", "is")
_INTENSIFIERS = ("very", "really", "truly", "quite")
# Phrases that carry no sentiment: times, places, names, unrelated objects.
_PREFIXES = (
    "yesterday",
    "last week",
    "on tuesday",
    "in paris",
    "according to anna",
    "as my friend tom said",
    "after the train ride",
    "during the rain",
    "next to the river",
    "in the old town",
)
_SUFFIXES = (
    "and the table was wooden",
    "while the bus waited outside",
    "said maria",
    "near the station",
    "with a red umbrella",
    "in the evening",
    "and we drank tea",
    "before the bicycle race",
    "on the second floor",
    "and the window was open",
    "next to a green lamp",
    "with three chairs",
)
_DOUBLE_NEGATION = "it is not true that"


def sentiment_vocabulary():
    """Returns the sorted list of every token the generator can write."""
    words = set(POSITIVE_WORDS) | set(NEGATIVE_WORDS) | set(NEGATION_WORDS)
    for group in (
        _SUBJECTS,
        _VERBS,
        _INTENSIFIERS,
        _PREFIXES,
        _SUFFIXES,
        (_DOUBLE_NEGATION,),
    ):
        for phrase in group:
            words.update(phrase.split(" "))
    return sorted(words)


def make_sentiment_task(
    num_samples,
    seed=0,
    negation_rate=0.5,
    double_negation_rate=0.0,
    max_distractors=3,
    return_key_positions=False,
    exclude=None,
):
    """Generates sentiment sentences whose class a few tokens decide.

    A sentence is `[prefix phrases] [it is not true that] SUBJECT VERB
    [not|never] [intensifier] ADJECTIVE [suffix phrases]`. The label is 1
    (positive) when the adjective is positive and the number of negations
    is even, else 0. Intensifiers appear only without a negation, because
    "not very good" is weaker than "not good" rather than its opposite.

    Args:
        num_samples: number of sentences.
        seed: seed of the generator.
        negation_rate: probability of "not"/"never" before the adjective.
        double_negation_rate: probability of the clause being wrapped in
            "it is not true that", which flips the class again.
        max_distractors: most distractor phrases (prefix and suffix
            together); each sentence draws between 0 and this many.
        return_key_positions: also return, for each sentence, the token
            indices that decide its class.
        exclude: sentences left out (another split's): the generator
            repeats sentences, also across seeds, so splits drawn from
            different seeds share some unless each excludes the others'.
            The result is the first `num_samples` sentences of the stream
            of `seed` that are not in `exclude`.

    Returns:
        `(sentences, labels)`: a list of strings and an int32 array `(N,)`;
        with `return_key_positions=True`, a third list holding a sorted list
        of token indices per sentence (the adjective, the negation word and
        the "not" of "it is not true that", where present).

    Example:

    >>> sentences, labels, keys = make_sentiment_task(
    ...     2, seed=3, return_key_positions=True)
    >>> sentences[1], int(labels[1])
    ('during the rain the movie was not boring', 1)
    >>> [sentences[1].split(" ")[i] for i in keys[1]]
    ['not', 'boring']
    """
    if not isinstance(num_samples, (int, np.integer)) or num_samples < 0:
        raise ValueError(
            "Received an invalid value for argument `num_samples`, expected a "
            f"non-negative integer. Received: num_samples={num_samples}"
        )
    for name, value in (
        ("negation_rate", negation_rate),
        ("double_negation_rate", double_negation_rate),
    ):
        if not 0.0 <= value <= 1.0:
            raise ValueError(
                f"Received an invalid value for argument `{name}`, expected "
                f"a probability in [0, 1]. Received: {name}={value}"
            )
    if (
        not isinstance(max_distractors, (int, np.integer))
        or max_distractors < 0
    ):
        raise ValueError(
            "Received an invalid value for argument `max_distractors`, "
            "expected a non-negative integer. Received: "
            f"max_distractors={max_distractors}"
        )
    if exclude is not None:
        return _excluding(
            set(exclude), num_samples, seed, return_key_positions,
            dict(negation_rate=negation_rate,
                 double_negation_rate=double_negation_rate,
                 max_distractors=max_distractors),
        )
    rng = np.random.default_rng(seed)
    sentences, labels, keys = [], [], []
    for _ in range(num_samples):
        positive = bool(rng.integers(2))
        negated = bool(rng.random() < negation_rate)
        doubled = bool(rng.random() < double_negation_rate)
        num_distractors = int(rng.integers(0, max_distractors + 1))
        num_prefixes = int(rng.integers(0, num_distractors + 1))
        num_suffixes = num_distractors - num_prefixes

        tokens, key = [], []
        for _ in range(num_prefixes):
            tokens += _PREFIXES[rng.integers(len(_PREFIXES))].split(" ")
        if doubled:
            key.append(len(tokens) + 2)  # the "not" of "it is not true that"
            tokens += _DOUBLE_NEGATION.split(" ")
        tokens += _SUBJECTS[rng.integers(len(_SUBJECTS))].split(" ")
        verbs = _NEGATABLE_VERBS if negated else _VERBS
        tokens.append(verbs[rng.integers(len(verbs))])
        if negated:
            key.append(len(tokens))
            tokens.append(NEGATION_WORDS[rng.integers(len(NEGATION_WORDS))])
        elif rng.random() < 0.3:
            tokens.append(_INTENSIFIERS[rng.integers(len(_INTENSIFIERS))])
        words = POSITIVE_WORDS if positive else NEGATIVE_WORDS
        key.append(len(tokens))
        tokens.append(words[rng.integers(len(words))])
        for _ in range(num_suffixes):
            tokens += _SUFFIXES[rng.integers(len(_SUFFIXES))].split(" ")

        sentences.append(" ".join(tokens))
        labels.append(int(positive) ^ int(negated) ^ int(doubled))
        keys.append(key)
    labels = np.asarray(labels, dtype="int32")
    if return_key_positions:
        return sentences, labels, keys
    return sentences, labels


def _excluding(excluded, num_samples, seed, return_key_positions, options):
    """`make_sentiment_task` without the sentences of `excluded`: the same
    stream (a longer draw of one seed starts with the shorter one), read
    until `num_samples` sentences outside `excluded` are found."""
    count = num_samples + len(excluded)
    while True:
        sentences, labels, keys = make_sentiment_task(
            count, seed=seed, return_key_positions=True, **options
        )
        kept = [i for i, s in enumerate(sentences) if s not in excluded]
        if len(kept) >= num_samples or count > 100 * (num_samples + len(excluded)):
            break
        count *= 2
    if len(kept) < num_samples:
        raise ValueError(
            "Received an invalid value for argument `exclude`: the generator "
            f"gave only {len(kept)} sentences outside it, fewer than "
            f"num_samples={num_samples}"
        )
    kept = kept[:num_samples]
    out = ([sentences[i] for i in kept], labels[np.asarray(kept, dtype="int64")])
    return out + ([keys[i] for i in kept],) if return_key_positions else out
