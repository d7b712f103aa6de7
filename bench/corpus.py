"""Synthetic memory notes for the benchmarks: varied, sentence-length, deterministic by seed.

They read like what an assistant stores about a user (people, places, preferences, work
facts), so MiniLM and BM25 see realistic text lengths and vocabulary; they are not a quality
set (see bench/data/devset.json for that)."""

from __future__ import annotations

import random

PEOPLE = [
    "Alec",
    "Sarah",
    "Priya",
    "Jonas",
    "Ellen",
    "Ken",
    "Marta",
    "Omar",
    "Lena",
    "Diego",
    "Yuki",
    "Noah",
    "Fatima",
    "Ivan",
    "Chloe",
    "Ravi",
    "Hana",
    "Tomas",
    "Grace",
    "Malik",
]
RELATIONS = [
    "manager",
    "sister",
    "neighbour",
    "dentist",
    "landlord",
    "colleague",
    "cousin",
    "mentor",
    "accountant",
    "piano teacher",
    "running partner",
    "oldest friend",
]
PLACES = [
    "Lisbon",
    "Austin",
    "Osaka",
    "Toronto",
    "Nairobi",
    "Berlin",
    "Lima",
    "Oslo",
    "Porto",
    "Denver",
    "Seoul",
    "Dublin",
    "Accra",
    "Melbourne",
    "Krakow",
    "Valencia",
]
FOODS = [
    "sushi",
    "ramen",
    "tacos",
    "lentil soup",
    "dark chocolate",
    "espresso",
    "green tea",
    "pad thai",
    "sourdough",
    "mango",
    "falafel",
    "goat cheese",
]
ACTIVITIES = [
    "climbing",
    "padel",
    "swimming",
    "chess",
    "pottery",
    "birdwatching",
    "cycling",
    "yoga",
    "woodworking",
    "salsa dancing",
    "photography",
    "sailing",
]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
PROJECTS = ["Kestrel", "Atlas", "Bluebird", "Quartz", "Nimbus", "Harbor", "Juniper", "Falcon"]
TOOLS = ["Figma", "Linear", "Jira", "Notion", "VS Code", "Vim", "Postgres", "Kubernetes", "Slack", "Excel"]
MONTHS = ["January", "March", "April", "June", "August", "September", "October", "December"]

TEMPLATES = [
    "{person} is my {relation} and lives in {place}.",
    "I usually have {food} for lunch on {day}s.",
    "I go {activity} every {day} evening with {person}.",
    "The {project} project ships in {month}; {person} owns the release checklist.",
    "Please remind me to call {person} about the trip to {place} next {month}.",
    "I can't stand {food}, so never suggest it when we plan dinner.",
    "My {relation} {person} recommended {tool} for keeping track of the {project} tasks.",
    "We moved the {project} review to {day} mornings because {person} is in {place} until {month}.",
    "I'm saving up for a {activity} holiday in {place} in {month}.",
    "When I'm stressed I make {food} and listen to podcasts about {activity}.",
    "{person} prefers {tool} over everything else and hates long meetings.",
    "The {project} dashboard lives in {tool}; ask {person} for access.",
    "I used to live in {place}, before moving for the {project} job.",
    "Every {month} I visit my {relation} {person} in {place}.",
    "I started learning {activity} in {month} and practise on {day}s.",
]


DETAILS = [
    "It takes about {n} minutes.",
    "That was {n} days ago.",
    "It cost {n} dollars.",
    "{person} mentioned it {n} times.",
    "The booking reference is {code}.",
    "We agreed on {n} people at most.",
    "It is {n} km from home.",
    "The ticket number was {code}.",
]


def note_text(rng: random.Random) -> str:
    """One fact and one detail: sentence-length, and (nearly) never the same text twice, as
    real notes of different users are."""
    return f"{_fill(rng, rng.choice(TEMPLATES))} {_fill(rng, rng.choice(DETAILS))}"


def _fill(rng: random.Random, template: str) -> str:
    return template.format(
        n=rng.randrange(2, 1000),
        code=f"{rng.choice('ABCDEFGHJKLMNPQRSTUVWXYZ')}{rng.randrange(1000, 10000)}",
        person=rng.choice(PEOPLE),
        relation=rng.choice(RELATIONS),
        place=rng.choice(PLACES),
        food=rng.choice(FOODS),
        activity=rng.choice(ACTIVITIES),
        day=rng.choice(DAYS),
        project=rng.choice(PROJECTS),
        tool=rng.choice(TOOLS),
        month=rng.choice(MONTHS),
    )


QUESTIONS = [
    "Where does {person} live?",
    "What do I eat for lunch?",
    "Which hobby do I do with {person}?",
    "When does {project} launch?",
    "What food do I dislike?",
    "Which tool do we use for {project}?",
    "Where did I live before?",
    "Who should I ask about the {project} dashboard?",
    "Did {person} mention anything about {place}?",
    "What do I know about {person}'s plans for {month}?",
    "When am I going {activity} with {person}?",
    "What did {person} say about {tool}?",
    "Is {food} something I like?",
    "What happens with {project} in {month}?",
    "Who is my {relation}?",
    "Have I ever been to {place} for {activity}?",
]


def question_text(rng: random.Random) -> str:
    return rng.choice(QUESTIONS).format(
        person=rng.choice(PEOPLE),
        project=rng.choice(PROJECTS),
        place=rng.choice(PLACES),
        month=rng.choice(MONTHS),
        activity=rng.choice(ACTIVITIES),
        tool=rng.choice(TOOLS),
        food=rng.choice(FOODS),
        relation=rng.choice(RELATIONS),
    )


def notes(seed: int, count: int) -> list[str]:
    rng = random.Random(seed)
    return [note_text(rng) for _ in range(count)]
