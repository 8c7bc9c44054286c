"""The demo corpus: short stories about a small world whose facts never change, generated from the tables below.

`bertforge pretrain` with no arguments trains on it. Real text teaches a small BERT slowly: on The Devil's
Dictionary, or an hour of Wikipedia and Gutenberg (bench/pretrain_quality.py), a 2-core machine's model still
answers most [MASK]s with "the", "of" or a comma. Here every fact (a dog barks, snow is white, Tuesday follows
Monday, Paris is the capital of France) is told many times in different words and next to different other facts,
so that what fills a blank depends on its sentence, and a tiny model learns that in two minutes. It is the same
thing pretraining does with real text, on a world small enough to see it happen.

    python -m bertforge.data.demo_world OUT.txt.gz      # write the corpus (what `DEMO_CORPUS` is)

`documents(seed)` is deterministic: the same seed gives the same text with any Python 3. The bundled
`demo_corpus.txt.gz` is `write(path)`'s output, checked by the tests.
"""

from __future__ import annotations

import gzip
import random
import sys
from pathlib import Path

DEMO_CORPUS = Path(__file__).with_name("demo_corpus.txt.gz")
SEED = 0
N_DOCUMENTS = 4000

NAMES = ["Anna", "Ben", "Clara", "David", "Emma", "Felix", "Grace", "Henry", "Iris", "Jack", "Lucy", "Max", "Nora",
         "Oscar", "Rosa", "Sam", "Tom", "Vera"]

# animal: (the sound it makes, what it eats, where it lives, what its young is called)
ANIMALS = {
    "dog": ("barks", "bones", "kennel", "puppy"),
    "cat": ("meows", "fish", "basket", "kitten"),
    "cow": ("moos", "grass", "barn", "calf"),
    "horse": ("neighs", "hay", "stable", "foal"),
    "sheep": ("bleats", "clover", "field", "lamb"),
    "pig": ("grunts", "apples", "sty", "piglet"),
    "duck": ("quacks", "bread", "pond", "duckling"),
    "owl": ("hoots", "mice", "tree", "owlet"),
    "bee": ("buzzes", "nectar", "hive", "larva"),
    "lion": ("roars", "meat", "den", "cub"),
    "frog": ("croaks", "flies", "pond", "tadpole"),
    "hen": ("clucks", "corn", "coop", "chick"),
    "goat": ("bleats", "leaves", "shed", "kid"),
    "mouse": ("squeaks", "cheese", "hole", "pup"),
    "monkey": ("chatters", "bananas", "jungle", "baby"),
    "rabbit": ("thumps", "carrots", "burrow", "bunny"),
}

COLOURS = {"snow": "white", "milk": "white", "the sky": "blue", "the sea": "blue", "grass": "green",
           "a leaf": "green", "a banana": "yellow", "the sun": "yellow", "a lemon": "yellow", "a tomato": "red",
           "blood": "red", "a cherry": "red", "coal": "black", "the night": "black", "an orange": "orange",
           "a carrot": "orange", "a plum": "purple", "chocolate": "brown", "mud": "brown", "ash": "grey"}

DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December"]
SEASONS = {"winter": ("cold", "it snows"), "spring": ("mild", "the flowers grow"),
           "summer": ("hot", "the sun shines"), "autumn": ("cool", "the leaves fall")}
SEASON_OF_MONTH = ["winter", "winter", "spring", "spring", "spring", "summer", "summer", "summer", "autumn",
                   "autumn", "autumn", "winter"]
NUMBERS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve"]

CAPITALS = {"France": "Paris", "England": "London", "Italy": "Rome", "Spain": "Madrid", "Germany": "Berlin",
            "Japan": "Tokyo", "Egypt": "Cairo", "Russia": "Moscow", "China": "Beijing", "Greece": "Athens",
            "Ireland": "Dublin", "Portugal": "Lisbon", "Norway": "Oslo", "Poland": "Warsaw", "Austria": "Vienna",
            "Kenya": "Nairobi"}

# job: (what the person does, where)
JOBS = {"baker": ("bakes bread", "bakery"), "farmer": ("grows wheat", "farm"), "doctor": ("helps sick people",
        "hospital"), "teacher": ("teaches children", "school"), "pilot": ("flies planes", "airport"),
        "fisherman": ("catches fish", "harbour"), "painter": ("paints pictures", "studio"),
        "builder": ("builds houses", "town"), "singer": ("sings songs", "theatre"), "cook": ("makes soup",
        "kitchen"), "librarian": ("lends books", "library"), "gardener": ("plants flowers", "garden")}

OPPOSITES = [("hot", "cold"), ("big", "small"), ("up", "down"), ("day", "night"), ("fast", "slow"),
             ("old", "young"), ("happy", "sad"), ("open", "closed"), ("wet", "dry"), ("early", "late"),
             ("full", "empty"), ("light", "heavy")]

# What `bertforge pretrain` asks its model before and after training: a sentence of the world with one word
# masked, and the word the corpus always puts there (each answer read from the tables above). Different sentences
# want different words, so a model whose answers change with the sentence has learnt to read its context.
PROBES = [
    ("The dog [MASK].", ANIMALS["dog"][0]),
    ("When it is hungry, the cow [MASK].", ANIMALS["cow"][0]),
    ("The horse eats [MASK].", ANIMALS["horse"][1]),
    ("A baby cat is called a [MASK].", ANIMALS["cat"][3]),
    ("The capital of France is [MASK].", CAPITALS["France"]),
    ("The capital of Japan is [MASK].", CAPITALS["Japan"]),
    ("After Monday comes [MASK].", DAYS[1]),
    ("In winter it is [MASK].", SEASONS["winter"][0]),
    ("Snow is [MASK].", COLOURS["snow"]),
    ("The colour of the sky is [MASK].", COLOURS["the sky"]),
    ("The opposite of big is [MASK].", dict(OPPOSITES)["big"]),
    ("The baker bakes bread at the [MASK].", JOBS["baker"][1]),
]

WHEN = ["Every morning", "In the evening", "At night", "Every day", "On Sunday", "After lunch", "Before dinner",
        "Today", "Once again", "As always"]


def article(noun: str) -> str:
    return f"an {noun}" if noun[0] in "aeiou" else f"a {noun}"


def capital(sentence: str) -> str:
    return sentence[0].upper() + sentence[1:]


def animal_sentences(rng: random.Random, name: str) -> list[str]:
    animal = rng.choice(sorted(ANIMALS))
    sound, food, home, young = ANIMALS[animal]
    when = rng.choice(WHEN)
    told = [
        rng.choice([f"{name} has {article(animal)}.", f"{name} looks after {article(animal)}.",
                    f"There is {article(animal)} on {name}'s farm."]),
        rng.choice([f"The {animal} {sound}.", f"{when} the {animal} {sound}.", f"{name} hears the {animal}: it {sound}.",
                    f"When it is hungry, the {animal} {sound}."]),
        rng.choice([f"The {animal} eats {food}.", f"{name} gives the {animal} some {food}.",
                    f"{when} the {animal} eats {food}.", f"The {animal} likes {food} best."]),
        rng.choice([f"The {animal} lives in {article(home)}.", f"At night the {animal} sleeps in its {home}.",
                    f"{name} cleans the {animal}'s {home}."]),
        rng.choice([f"The young of the {animal} is called {article(young)}.", f"The {animal} has a little {young}.",
                    f"A baby {animal} is called {article(young)}."]),
    ]
    return [told[0]] + rng.sample(told[1:], rng.randint(2, 4))


def colour_sentences(rng: random.Random, name: str) -> list[str]:
    things = rng.sample(sorted(COLOURS), 2)
    return [rng.choice([f"{capital(t)} is {COLOURS[t]}.", f"{name} says that {t} is {COLOURS[t]}.",
                        f"{name} paints {t} {COLOURS[t]}.", f"The colour of {t} is {COLOURS[t]}."]) for t in things]


def calendar_sentences(rng: random.Random, name: str) -> list[str]:
    d = rng.randrange(7)
    m = rng.randrange(12)
    season = SEASON_OF_MONTH[m]
    weather, happens = SEASONS[season]
    return rng.sample([
        rng.choice([f"Today is {DAYS[d]}, and tomorrow is {DAYS[(d + 1) % 7]}.",
                    f"After {DAYS[d]} comes {DAYS[(d + 1) % 7]}.", f"Yesterday was {DAYS[d - 1]}, so today is {DAYS[d]}."]),
        rng.choice([f"After {MONTHS[m]} comes {MONTHS[(m + 1) % 12]}.", f"{MONTHS[m]} comes before {MONTHS[(m + 1) % 12]}.",
                    f"{name} was born in {MONTHS[m]}, in the {season}."]),
        rng.choice([f"In {season} it is {weather}.", f"In {season} {happens}.", f"{capital(season)} is {weather}, and {happens}.",
                    f"{name} likes {season}, because {happens}."]),
    ], rng.randint(1, 3))


def world_sentences(rng: random.Random, name: str) -> list[str]:
    country = rng.choice(sorted(CAPITALS))
    city = CAPITALS[country]
    job = rng.choice(sorted(JOBS))
    work, place = JOBS[job]
    a, b = rng.choice(OPPOSITES)
    x, y = rng.randint(0, 6), rng.randint(0, 6)
    n = rng.randint(1, 8)
    return rng.sample([
        rng.choice([f"The capital of {country} is {city}.", f"{name} travels to {country} and visits {city}.",
                    f"{city} is the capital of {country}.", f"{name} lives in {city}, in {country}."]),
        rng.choice([f"{name}'s mother is {article(job)}: she {work}.", f"The {job} {work} at the {place}.",
                    f"{name} wants to be {article(job)} and work at the {place}."]),
        rng.choice([f"The opposite of {a} is {b}.", f"{capital(b)} is the opposite of {a}."]),
        rng.choice([f"{capital(NUMBERS[x])} and {NUMBERS[y]} make {NUMBERS[x + y]}.",
                    f"{name} counts: {NUMBERS[n]}, {NUMBERS[n + 1]}, {NUMBERS[n + 2]}, {NUMBERS[n + 3]}."]),
    ], rng.randint(1, 3))


def document(rng: random.Random) -> list[str]:
    """One story: a person, their animal, and a few other facts, one sentence per line."""
    name = rng.choice(NAMES)
    parts = [animal_sentences(rng, name), colour_sentences(rng, name), calendar_sentences(rng, name),
             world_sentences(rng, name)]
    first, rest = parts[0], parts[1:]
    rng.shuffle(rest)
    return [sentence for part in [first, *rest] for sentence in part]


def documents(seed: int = SEED, n: int = N_DOCUMENTS) -> list[list[str]]:
    rng = random.Random(seed)
    return [document(rng) for _ in range(n)]


def write(path: str | Path, seed: int = SEED, n: int = N_DOCUMENTS) -> None:
    """The corpus as gzipped text: one sentence per line, a blank line between documents (the layout every
    corpus reader here takes). mtime 0, so the same text gives the same bytes."""
    text = "\n\n".join("\n".join(doc) for doc in documents(seed, n)) + "\n"
    with open(path, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as fh:
        fh.write(text.encode("utf-8"))


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit("usage: python -m bertforge.data.demo_world OUT.txt.gz")
    write(sys.argv[1])


if __name__ == "__main__":
    main()
