"""Vocabulary of the ``fncall`` environment: parameters, functions, verb families and value pools.

This module is data. Each ``Param`` is a reusable argument concept (a radius, a city, a list of
scores) with its JSON type, the words people use for it, the snake_case names a schema may give
it, how its values are drawn and inline phrasings (``says``, with ``{v}`` for the value). Each
``Func`` is a function concept of one domain (``compound interest`` in finance) with its verb
family, its parameters (``?key`` = optional, with the parameter's default) and the kind of
result it returns. ``fncall_gen`` turns these into randomised schemas and user requests.

Function names are built from a family verb and the object phrase (``calculate_compound_interest``,
``finance.compound_interest``); the test suite checks that no two functions can produce the same
name, so holding functions out of training really holds their names out.

Written from general knowledge of function-calling data (xLAM/APIGen/Glaive-style); no benchmark
entry was used to write it.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Gen = Callable[[random.Random], str]


# ---------------------------------------------------------------------------------------------
# Value pools and generators

CITIES = ("Paris", "London", "Tokyo", "New York", "Sydney", "Toronto", "Berlin", "Madrid", "Rome", "Cairo",
          "Mumbai", "Seoul", "Chicago", "Boston", "Denver", "Lisbon", "Dublin", "Oslo", "Vienna", "Prague",
          "Nairobi", "Lima", "Bogota", "Austin", "Seattle", "Miami", "Vancouver", "Singapore", "Bangkok",
          "Istanbul", "Athens", "Stockholm", "Helsinki", "Zurich", "Amsterdam", "Brussels", "Warsaw", "Budapest",
          "Buenos Aires", "Santiago", "Mexico City", "Cape Town", "Melbourne", "Auckland", "Osaka", "Hanoi",
          "Manila", "Jakarta", "Dubai", "Montreal", "San Francisco", "Los Angeles", "Edinburgh", "Barcelona")
COUNTRIES = ("France", "Japan", "Brazil", "Canada", "Germany", "India", "Kenya", "Mexico", "Italy", "Spain",
             "Egypt", "Australia", "Norway", "Peru", "Chile", "Vietnam", "Argentina", "Sweden", "Poland", "Greece",
             "Portugal", "Thailand", "Nigeria", "Morocco", "Ireland", "Turkey", "Indonesia", "Colombia",
             "New Zealand", "South Korea", "Finland", "Denmark", "Austria", "Switzerland", "Ghana", "Ethiopia")
US_STATES = ("California", "Texas", "New York", "Florida", "Illinois", "Ohio", "Georgia", "Washington",
             "Oregon", "Colorado", "Arizona", "Nevada", "Michigan", "Virginia", "Massachusetts", "Minnesota")
TICKERS = ("AAPL", "MSFT", "GOOGL", "AMZN", "TSLA", "NVDA", "META", "IBM", "ORCL", "INTC", "NFLX", "AMD",
           "KO", "PEP", "DIS", "NKE")
CURRENCIES = ("USD", "EUR", "GBP", "JPY", "CAD", "AUD", "CHF", "CNY", "INR", "MXN", "BRL", "SEK")
LANGUAGES = ("English", "Spanish", "French", "German", "Italian", "Japanese", "Korean", "Portuguese", "Dutch",
             "Swedish", "Polish", "Turkish", "Hindi", "Arabic")
AIRPORTS = ("JFK", "LAX", "LHR", "CDG", "HND", "SFO", "ORD", "DXB", "SIN", "FRA", "AMS", "MAD", "SEA", "BOS",
            "YYZ", "SYD", "FCO", "IST", "DEN", "MIA")
TEAMS = ("Lakers", "Celtics", "Warriors", "Bulls", "Yankees", "Dodgers", "Red Sox", "Arsenal", "Chelsea",
         "Liverpool", "Barcelona", "Real Madrid", "Juventus", "Bayern Munich", "Ajax", "Packers", "Patriots",
         "Maple Leafs", "Canadiens", "Rangers")
LEAGUES = ("NBA", "NFL", "MLB", "NHL", "Premier League", "La Liga", "Serie A", "Bundesliga", "MLS")
TOURNAMENTS = ("Wimbledon", "US Open", "Australian Open", "French Open", "Tour de France", "Masters",
               "World Cup", "Champions League", "Super Bowl", "Stanley Cup")
DISHES = ("lasagna", "pad thai", "chicken curry", "pancakes", "beef stew", "mushroom risotto", "fish tacos",
          "tomato soup", "banana bread", "vegetable stir fry", "paella", "apple pie", "ramen", "falafel",
          "shepherd's pie", "carbonara", "chili con carne", "greek salad", "omelette", "brownies")
INGREDIENTS = ("eggs", "flour", "milk", "sugar", "butter", "garlic", "onion", "tomato", "rice", "chicken",
               "basil", "spinach", "cheese", "potato", "carrot", "lemon", "honey", "yogurt", "tofu", "beans",
               "mushrooms", "salmon", "oats", "cinnamon", "ginger", "avocado", "pasta", "bell pepper")
FOODS = ("apple", "banana", "brown rice", "chicken breast", "almonds", "broccoli", "salmon", "oatmeal",
         "avocado", "whole milk", "cheddar cheese", "lentils", "sweet potato", "greek yogurt", "peanut butter")
FORMULAS = ("H2O", "NaCl", "CO2", "C6H12O6", "CH4", "NH3", "H2SO4", "C2H5OH", "CaCO3", "KMnO4", "HCl",
            "NaOH", "Fe2O3", "C8H10N4O2", "MgSO4", "O2")
COMPOUNDS = ("water", "ethanol", "acetone", "benzene", "methanol", "glycerol", "toluene", "acetic acid",
             "ammonia", "hexane", "chloroform", "isopropanol")
ELEMENTS = ("hydrogen", "helium", "carbon", "nitrogen", "oxygen", "sodium", "magnesium", "aluminum", "silicon",
            "sulfur", "chlorine", "potassium", "calcium", "iron", "copper", "zinc", "silver", "gold", "lead",
            "uranium", "neon", "argon", "lithium", "titanium")
PLANETS = ("Mercury", "Venus", "Earth", "Mars", "Jupiter", "Saturn", "Uranus", "Neptune")
STARS = ("Sirius", "Vega", "Betelgeuse", "Polaris", "Rigel", "Altair", "Deneb", "Arcturus", "Antares",
         "Aldebaran", "Capella", "Procyon", "Spica", "Proxima Centauri")
PROTEINS = ("insulin", "hemoglobin", "collagen", "keratin", "myosin", "actin", "albumin", "ferritin",
            "lactase", "amylase", "pepsin", "fibrinogen")
ANIMALS = ("lion", "gray wolf", "bald eagle", "blue whale", "red fox", "snow leopard", "giant panda",
           "emperor penguin", "african elephant", "green sea turtle", "monarch butterfly", "koala",
           "bottlenose dolphin", "polar bear", "honey bee")
EVENTS = ("French Revolution", "Battle of Hastings", "fall of the Berlin Wall", "moon landing",
          "signing of the Magna Carta", "Boston Tea Party", "discovery of penicillin", "Treaty of Versailles",
          "invention of the printing press", "first powered flight", "founding of Rome",
          "eruption of Mount Vesuvius")
FIGURES = ("Napoleon Bonaparte", "Cleopatra", "Abraham Lincoln", "Marie Curie", "Leonardo da Vinci",
           "Julius Caesar", "Queen Victoria", "Mahatma Gandhi", "Galileo Galilei", "Joan of Arc",
           "Genghis Khan", "Ada Lovelace", "Nelson Mandela", "Isaac Newton")
WARS = ("Hundred Years' War", "American Civil War", "Seven Years' War", "Napoleonic Wars", "Crimean War",
        "Peloponnesian War", "War of the Roses", "Thirty Years' War")
RIVERS = ("Nile", "Amazon", "Yangtze", "Mississippi", "Danube", "Rhine", "Ganges", "Volga", "Thames", "Mekong")
PRODUCTS = ("wireless headphones", "running shoes", "coffee maker", "laptop stand", "yoga mat", "desk lamp",
            "backpack", "smart watch", "electric kettle", "office chair", "water bottle", "phone case")
DRUGS = ("ibuprofen", "paracetamol", "amoxicillin", "cetirizine", "loratadine", "omeprazole", "metformin",
         "aspirin")
SYMPTOMS = ("fever", "headache", "cough", "sore throat", "fatigue", "nausea", "dizziness", "back pain",
            "runny nose", "muscle aches")
TIMEZONES = ("UTC", "America/New_York", "America/Los_Angeles", "Europe/London", "Europe/Paris", "Asia/Tokyo",
             "Asia/Kolkata", "Australia/Sydney", "America/Chicago", "Europe/Berlin", "Asia/Singapore")
WORDS = ("serendipity", "ephemeral", "resilient", "benevolent", "meticulous", "ubiquitous", "candid",
         "eloquent", "pragmatic", "whimsical", "tenacious", "lucid", "vivid", "frugal", "jovial", "nimble",
         "ocean", "garden", "journey", "harmony", "lantern", "thunder", "velvet", "meadow")
PALINDROMES = ("level", "racecar", "radar", "noon", "civic", "kayak", "refer", "madam", "rotor", "stats")
NOTES = ("C4", "D4", "E4", "F4", "G4", "A4", "B4", "C5", "E5", "A3", "G3")
GENOTYPES = ("homozygous dominant", "heterozygous", "homozygous recessive")  # AA/Aa/aa differ only by case
INSTRUMENTS = ("piano", "guitar", "violin", "drums", "cello", "flute", "saxophone", "trumpet")
CARBON_ACTIVITIES = ("car travel", "flight", "train travel", "bus travel", "electricity use", "natural gas use")
LAW_TOPICS = ("breach of contract", "trademark infringement", "wrongful termination", "data privacy",
              "landlord tenant dispute", "medical malpractice", "copyright fair use", "product liability")
_FIRST = ("Alice", "Bruno", "Chloe", "Diego", "Elena", "Farah", "George", "Hana", "Ivan", "Julia", "Kenji",
          "Laura", "Mateo", "Nora", "Omar", "Priya", "Quinn", "Rosa", "Samir", "Tara", "Umar", "Vera", "Wei",
          "Yara", "Zoe", "Liam", "Maya", "Noah", "Emma", "Lucas")
_LAST = ("Moreno", "Smith", "Tanaka", "Okafor", "Novak", "Schmidt", "Rossi", "Kowalski", "Dubois", "Silva",
         "Nguyen", "Patel", "Haddad", "Johansson", "Murphy", "Garcia", "Kim", "Lopez", "Fischer", "Costa")
_ADJ = ("Silent", "Golden", "Broken", "Hidden", "Electric", "Midnight", "Crimson", "Distant", "Wild", "Frozen",
        "Velvet", "Last", "Burning", "Quiet", "Endless", "Paper", "Neon", "Lonely", "Brave", "Summer")
_NOUN = ("River", "Horizon", "Garden", "Kingdom", "Signal", "Harbor", "Mirror", "Echo", "Journey", "Storm",
         "Lantern", "Forest", "Machine", "Ocean", "Letter", "Valley", "Shadow", "Engine", "Crown", "Road")
_STREETS = ("Maple Street", "Oak Avenue", "Pine Road", "Elm Street", "Cedar Lane", "Lake Drive", "Hill Road",
            "Park Avenue", "River Street", "Sunset Boulevard")
_PHRASE_WORDS = ("hello", "world", "quick", "brown", "fox", "data", "science", "open", "source", "green",
                 "apple", "music", "river", "light", "blue", "sky", "happy", "coding", "coffee", "morning",
                 "simple", "test", "sunny", "day", "little", "star", "bright", "night", "city", "garden")
_DOMAINS_WEB = ("example.com", "mysite.org", "shop.net", "news.io", "blog.dev")


def person(rng: random.Random) -> str:
    return f"{rng.choice(_FIRST)} {rng.choice(_LAST)}"


def title(rng: random.Random) -> str:
    return f"{rng.choice(('The ', ''))}{rng.choice(_ADJ)} {rng.choice(_NOUN)}"


def phrase(rng: random.Random) -> str:
    return " ".join(rng.sample(_PHRASE_WORDS, rng.randint(2, 4)))


def dna(rng: random.Random) -> str:
    return "".join(rng.choice("ACGT") for _ in range(rng.randint(8, 16)))


def date(rng: random.Random) -> str:
    return f"{rng.randint(2019, 2026)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"


def past_date(rng: random.Random) -> str:
    return f"{rng.randint(1950, 2005)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"


def clock(rng: random.Random) -> str:
    return f"{rng.randint(0, 23):02d}:{rng.choice((0, 15, 30, 45)):02d}"


def order_id(rng: random.Random) -> str:
    return f"ORD-{rng.randint(10000, 99999)}"


def sku(rng: random.Random) -> str:
    return f"SKU-{rng.randint(1000, 9999)}"


def case_number(rng: random.Random) -> str:
    return f"{rng.choice(('CV', 'CR', 'AP'))}-{rng.randint(2010, 2025)}-{rng.randint(100, 9999):04d}"


def case_name(rng: random.Random) -> str:
    a, b = rng.sample(_LAST, 2)
    return f"{a} v. {b}"


def ip_address(rng: random.Random) -> str:
    return ".".join(str(rng.randint(1, 254)) for _ in range(4))


def email(rng: random.Random) -> str:
    return f"{rng.choice(_FIRST).lower()}.{rng.choice(_LAST).lower()}@{rng.choice(_DOMAINS_WEB)}"


def url(rng: random.Random) -> str:
    return f"https://www.{rng.choice(_DOMAINS_WEB)}/{rng.choice(_PHRASE_WORDS)}/{rng.randint(1, 999)}"


def zip_code(rng: random.Random) -> str:
    return f"{rng.randint(10000, 99999)}"


def address(rng: random.Random) -> str:
    return f"{rng.randint(1, 999)} {rng.choice(_STREETS)}"


def hex_color(rng: random.Random) -> str:
    return "#" + "".join(rng.choice("0123456789abcdef") for _ in range(6))


# ---------------------------------------------------------------------------------------------
# Parameters

@dataclass(frozen=True)
class Param:
    """One argument concept; ``fncall_gen`` draws its schema name, description and value."""

    key: str
    type: str  # "integer" | "number" | "string" | "boolean" | "enum" | "array"
    nouns: tuple[str, ...]
    names: tuple[str, ...]
    unit: str = ""
    lo: float = 1
    hi: float = 100
    dp: int = 0
    pool: tuple[str, ...] = ()
    gen: Gen | None = None
    item: str = ""  # array item type: "integer" | "number" | "string"
    size: tuple[int, int] = (3, 6)
    step: int = 1  # integers: values are multiples of step
    says: tuple[str, ...] = ()
    yes: tuple[str, ...] = ()
    no: tuple[str, ...] = ()
    quote: bool = False  # free text: always quoted in requests so its extent is unambiguous
    default: Any = None


def _tup(x: str | tuple[str, ...]) -> tuple[str, ...]:
    return (x,) if isinstance(x, str) else tuple(x)


def whole(key: str, nouns: str | tuple[str, ...], lo: int, hi: int, *, unit: str = "", names: tuple[str, ...] = (),
          says: tuple[str, ...] = (), step: int = 1, default: int | None = None) -> Param:
    return Param(key, "integer", _tup(nouns), names or (key,), unit=unit, lo=lo, hi=hi, step=step, says=says,
                 default=default)


def num(key: str, nouns: str | tuple[str, ...], lo: float, hi: float, *, dp: int = 2, unit: str = "",
        names: tuple[str, ...] = (), says: tuple[str, ...] = (), default: float | None = None) -> Param:
    return Param(key, "number", _tup(nouns), names or (key,), unit=unit, lo=lo, hi=hi, dp=dp, says=says,
                 default=default)


def text(key: str, nouns: str | tuple[str, ...], pool: tuple[str, ...] = (), *, gen: Gen | None = None,
         names: tuple[str, ...] = (), says: tuple[str, ...] = (), quote: bool = False,
         default: str | None = None) -> Param:
    return Param(key, "string", _tup(nouns), names or (key,), pool=pool, gen=gen, says=says, quote=quote,
                 default=default)


def choice(key: str, nouns: str | tuple[str, ...], options: tuple[str, ...], *, names: tuple[str, ...] = (),
           says: tuple[str, ...] = (), default: str | None = None) -> Param:
    return Param(key, "enum", _tup(nouns), names or (key,), pool=options, says=says, default=default)


def flag(key: str, nouns: str | tuple[str, ...], yes: tuple[str, ...], no: tuple[str, ...], *,
         names: tuple[str, ...] = (), default: bool = False) -> Param:
    return Param(key, "boolean", _tup(nouns), names or (key,), yes=yes, no=no, default=default)


def nums(key: str, nouns: str | tuple[str, ...], lo: float, hi: float, *, dp: int = 0,
         size: tuple[int, int] = (3, 6), names: tuple[str, ...] = ()) -> Param:
    return Param(key, "array", _tup(nouns), names or (key,), lo=lo, hi=hi, dp=dp,
                 item="integer" if dp == 0 else "number", size=size)


def texts(key: str, nouns: str | tuple[str, ...], pool: tuple[str, ...] = (), *, gen: Gen | None = None,
          size: tuple[int, int] = (2, 4), names: tuple[str, ...] = ()) -> Param:
    return Param(key, "array", _tup(nouns), names or (key,), pool=pool, gen=gen, item="string", size=size)


_P: list[Param] = [
    # math
    whole("int_a", ("first number", "first integer"), 2, 500, names=("a", "num1", "number1", "x", "first")),
    whole("int_b", ("second number", "second integer"), 2, 500, names=("b", "num2", "number2", "y", "second")),
    whole("n_small", ("number", "integer"), 1, 20, names=("n", "number", "num", "value")),
    whole("n_big", ("number", "integer", "value"), 2, 100000, names=("n", "number", "num", "value")),
    whole("n_terms", ("term count", "count of terms", "length of the sequence"), 1, 40,
          names=("n", "terms", "count", "n_terms", "length"), says=("for the first {v} terms", "with {v} terms")),
    whole("coef_a", ("coefficient a", "quadratic coefficient"), 1, 12, names=("a", "coef_a", "coefficient_a")),
    whole("coef_b", ("coefficient b", "linear coefficient"), -30, 30, names=("b", "coef_b", "coefficient_b")),
    whole("coef_c", ("coefficient c", "constant term"), -40, 40, names=("c", "coef_c", "coefficient_c")),
    num("base_num", ("base", "base number"), 1, 50, dp=1, names=("base", "x", "base_number")),
    whole("exponent", ("exponent", "power"), 0, 12, names=("exponent", "power", "exp", "n")),
    num("radicand", ("number", "value"), 1, 10000, dp=2, names=("number", "x", "value", "num")),
    whole("precision", ("precision", "number of decimal places"), 0, 8, names=("precision", "decimals", "digits"),
          says=("rounded to {v} decimal places", "with {v} decimal places"), default=2),
    num("log_value", ("value", "number"), 1, 100000, dp=2, names=("value", "x", "number")),
    whole("log_base", ("base", "logarithm base"), 2, 16, names=("base", "log_base"), says=("in base {v}",),
          default=10),
    whole("set_size", ("total number of items", "set size", "pool size"), 2, 60, names=("n", "total", "total_items")),
    whole("pick_size", ("number of items chosen", "selection size", "sample size"), 1, 12,
          names=("k", "r", "choose", "selected_items"), says=("choosing {v}", "picking {v} at a time")),
    num("percent", ("percentage", "percent"), 1, 99, dp=1, names=("percent", "percentage", "pct"),
        says=("taking {v} percent", "at {v} percent")),
    num("total_amount", ("total", "whole amount", "number"), 10, 10000, dp=2, names=("total", "value", "whole")),
    nums("poly_coefs", ("coefficients", "polynomial coefficients"), -9, 9, size=(2, 5),
         names=("coefficients", "coeffs", "polynomial")),
    num("point_x", ("point", "x value"), -10, 10, dp=1, names=("x", "point", "at"), says=("at x = {v}", "at the point {v}")),
    num("lower", ("lower limit", "lower bound"), -10, 5, dp=1, names=("lower", "a", "lower_limit", "start")),
    num("upper", ("upper limit", "upper bound"), 6, 20, dp=1, names=("upper", "b", "upper_limit", "end")),
    num("any_number", ("number", "value"), -1000, 1000, dp=2, names=("number", "x", "value")),
    # geometry
    num("radius", "radius", 0.5, 100, dp=1, names=("radius", "r")),
    num("length", "length", 1, 200, dp=1, names=("length", "l", "len")),
    num("width", "width", 1, 200, dp=1, names=("width", "w")),
    num("height_geo", "height", 1, 150, dp=1, names=("height", "h")),
    num("base_len", ("base", "base length"), 1, 150, dp=1, names=("base", "b", "base_length")),
    num("side_a", ("first side", "side a", "first leg"), 1, 100, dp=1, names=("a", "side_a", "side1", "leg1")),
    num("side_b", ("second side", "side b", "second leg"), 1, 100, dp=1, names=("b", "side_b", "side2", "leg2")),
    num("side_c", ("third side", "side c"), 1, 100, dp=1, names=("c", "side_c", "side3", "leg3")),
    num("side", ("side length", "edge length"), 0.5, 80, dp=1, names=("side", "side_length", "edge", "a")),
    num("x1", ("first x coordinate", "x1"), -50, 50, dp=1, names=("x1", "x_1", "ax", "point1_x")),
    num("y1", ("first y coordinate", "y1"), -50, 50, dp=1, names=("y1", "y_1", "ay", "point1_y")),
    num("x2", ("second x coordinate", "x2"), -50, 50, dp=1, names=("x2", "x_2", "bx", "point2_x")),
    num("y2", ("second y coordinate", "y2"), -50, 50, dp=1, names=("y2", "y_2", "by", "point2_y")),
    whole("n_sides", ("number of sides", "side count"), 3, 20, names=("sides", "n_sides", "num_sides", "n"),
          says=("with {v} sides", "that has {v} sides")),
    num("base1", ("first base", "top base"), 1, 60, dp=1, names=("base1", "a", "top_base", "b1")),
    num("base2", ("second base", "bottom base"), 1, 60, dp=1, names=("base2", "b", "bottom_base", "b2")),
    choice("angle_unit", ("angle unit", "unit for angles"), ("degrees", "radians"), names=("unit", "angle_unit"),
           says=("in {v}",), default="degrees"),
    # finance
    num("principal", ("principal", "principal amount", "initial investment"), 500, 100000, dp=0, unit="dollars",
        names=("principal", "principal_amount", "initial_amount", "p")),
    num("annual_rate", ("annual interest rate", "interest rate", "yearly rate"), 0.01, 0.12, dp=3,
        names=("rate", "annual_rate", "interest_rate", "r"), default=0.05),
    num("rate_pct", ("interest rate", "annual rate in percent"), 1, 15, dp=1, unit="percent",
        names=("rate", "interest_rate", "annual_rate_percent", "apr")),
    whole("years", ("number of years", "duration in years", "term"), 1, 40, unit="years",
          names=("years", "time", "duration", "t", "term_years"), says=("over {v} years", "for {v} years")),
    whole("compounds", ("compounding frequency", "times compounded per year"), 2, 365,
          names=("n", "compounds_per_year", "frequency", "compounding"),
          says=("compounded {v} times a year", "with {v} compounding periods per year"), default=1),
    num("loan_amount", ("loan amount", "amount borrowed"), 1000, 500000, dp=0, unit="dollars",
        names=("loan_amount", "principal", "amount")),
    whole("loan_term", ("loan term", "term in years"), 1, 30, unit="years", names=("term", "years", "loan_term"),
          says=("over {v} years", "with a term of {v} years", "for {v} years")),
    num("gain", ("final value", "return amount", "gain"), 100, 100000, dp=2, unit="dollars",
        names=("gain", "final_value", "return_amount")),
    num("cost", ("cost", "investment cost", "initial cost"), 100, 100000, dp=2, unit="dollars",
        names=("cost", "investment", "initial_cost")),
    num("present_value", ("present value", "current value"), 100, 50000, dp=2, unit="dollars",
        names=("present_value", "pv", "amount")),
    whole("periods", ("number of periods", "periods"), 1, 50, names=("periods", "n", "num_periods"),
          says=("over {v} periods", "for {v} periods")),
    text("ticker", ("ticker", "stock ticker", "stock symbol", "company symbol"), TICKERS,
         names=("ticker", "symbol", "stock_symbol"), says=("for {v}", "of {v}")),
    choice("exchange", ("exchange", "stock exchange"), ("NASDAQ", "NYSE", "LSE", "TSX"), names=("exchange", "market"),
           says=("on the {v}", "listed on {v}"), default="NASDAQ"),
    num("money", ("amount", "sum"), 1, 10000, dp=2, names=("amount", "value", "money")),
    choice("from_currency", ("source currency", "currency to convert from"), CURRENCIES,
           names=("from_currency", "source", "base_currency", "from"), says=("from {v}",)),
    choice("to_currency", ("target currency", "currency to convert to"), CURRENCIES,
           names=("to_currency", "target", "target_currency", "to"), says=("to {v}", "into {v}")),
    num("price", ("price", "item price"), 1, 5000, dp=2, unit="dollars", names=("price", "amount", "item_price")),
    num("tax_rate", ("tax rate", "sales tax rate"), 0.01, 0.15, dp=3, names=("tax_rate", "rate", "tax")),
    num("bill", ("bill", "bill amount", "check total"), 5, 800, dp=2, unit="dollars",
        names=("bill", "bill_amount", "total", "amount")),
    whole("tip_pct", ("tip percentage", "tip"), 5, 30, unit="percent", names=("tip_percent", "tip", "percentage"),
          says=("with a tip of {v} percent", "tipping {v} percent")),
    whole("split", ("number of people", "party size"), 2, 12, names=("split", "people", "num_people", "split_between"),
          says=("split between {v} people", "shared by {v} people"), default=1),
    nums("cash_flows", ("cash flows", "yearly cash flows"), -5000, 9000, size=(3, 6),
         names=("cash_flows", "cashflows", "flows")),
    num("discount_rate", ("discount rate",), 0.01, 0.15, dp=2, names=("discount_rate", "rate", "r")),
    num("asset_cost", ("asset cost", "purchase price"), 1000, 200000, dp=0, unit="dollars",
        names=("cost", "asset_cost", "purchase_price")),
    num("salvage", ("salvage value", "residual value"), 0, 5000, dp=0, unit="dollars",
        names=("salvage_value", "salvage", "residual_value")),
    whole("useful_life", ("useful life", "lifetime in years"), 2, 30, unit="years",
          names=("useful_life", "life", "years")),
    num("fixed_costs", ("fixed costs",), 1000, 200000, dp=0, unit="dollars", names=("fixed_costs", "fixed_cost")),
    num("unit_price", ("price per unit", "unit price", "selling price"), 1, 500, dp=2, unit="dollars",
        names=("price_per_unit", "unit_price", "price")),
    num("unit_cost", ("variable cost per unit", "cost per unit"), 0.5, 300, dp=2, unit="dollars",
        names=("variable_cost", "cost_per_unit", "unit_cost")),
    num("inflation", ("inflation rate", "annual inflation"), 0.01, 0.1, dp=3, names=("inflation_rate", "inflation", "rate")),
    whole("history_days", ("number of days", "period in days"), 5, 365, unit="days", names=("days", "period", "window"),
          says=("for the last {v} days", "over the past {v} days")),
    flag("dividends", ("dividends", "dividend data"), ("including dividends", "with dividends included"),
         ("without dividends", "excluding dividends"), names=("include_dividends", "dividends", "with_dividends")),
    text("company", ("company", "company name"), ("Acme Corp", "Globex", "Initech", "Umbrella Inc", "Stark Industries",
                                                  "Wayne Enterprises", "Hooli", "Soylent Co", "Vandelay Industries"),
         names=("company", "company_name", "name")),
    whole("year", ("year", "fiscal year"), 1990, 2025, names=("year", "fiscal_year"), says=("in {v}", "for {v}")),
    # physics
    num("mass", ("mass", "object mass"), 0.1, 500, dp=1, unit="kilograms", names=("mass", "m", "mass_kg")),
    num("velocity", ("velocity", "speed"), 0.5, 120, dp=1, unit="meters per second", names=("velocity", "v", "speed")),
    num("height_m", ("height", "elevation"), 0.5, 500, dp=1, unit="meters", names=("height", "h", "height_m")),
    num("gravity", ("gravitational acceleration", "gravity"), 1.6, 24.8, dp=2, unit="meters per second squared",
        names=("gravity", "g"), default=9.81),
    num("acceleration", ("acceleration",), 0.1, 50, dp=1, unit="meters per second squared",
        names=("acceleration", "a", "accel")),
    num("initial_velocity", ("initial velocity", "starting speed"), 0, 80, dp=1, unit="meters per second",
        names=("initial_velocity", "v0", "u", "initial_speed")),
    num("time_s", ("time", "duration"), 0.5, 120, dp=1, unit="seconds", names=("time", "t", "duration", "seconds")),
    num("voltage", ("voltage",), 1, 480, dp=1, unit="volts", names=("voltage", "v", "volts")),
    num("resistance", ("resistance",), 1, 10000, dp=1, unit="ohms", names=("resistance", "r", "ohms")),
    num("work", ("work", "energy"), 1, 100000, dp=1, unit="joules", names=("work", "energy", "joules")),
    num("frequency", ("frequency",), 20, 20000, dp=1, unit="hertz", names=("frequency", "f", "freq")),
    num("wave_speed", ("wave speed", "propagation speed"), 100, 5000, dp=1, unit="meters per second",
        names=("wave_speed", "speed", "v"), default=343.0),
    num("volume_l", ("volume",), 0.1, 100, dp=2, unit="liters", names=("volume", "v", "volume_liters")),
    num("force", ("force",), 1, 10000, dp=1, unit="newtons", names=("force", "f", "newtons")),
    num("area_m2", ("area", "surface area"), 0.01, 100, dp=2, unit="square meters", names=("area", "a", "surface_area")),
    num("angle", ("launch angle", "angle"), 5, 85, dp=1, unit="degrees", names=("angle", "theta", "launch_angle")),
    num("charge1", ("first charge",), 1, 100, dp=1, unit="microcoulombs", names=("charge1", "q1", "charge_a")),
    num("charge2", ("second charge",), 1, 100, dp=1, unit="microcoulombs", names=("charge2", "q2", "charge_b")),
    num("distance_m", ("distance", "separation"), 0.01, 100, dp=2, unit="meters", names=("distance", "r", "d")),
    num("spring_k", ("spring constant",), 1, 5000, dp=1, unit="newtons per meter", names=("spring_constant", "k")),
    num("displacement", ("displacement", "stretch"), 0.01, 2, dp=2, unit="meters", names=("displacement", "x", "stretch")),
    choice("medium", ("medium",), ("air", "water", "steel", "glass"), names=("medium",), says=("in {v}", "through {v}"),
           default="air"),
    # chemistry
    text("formula", ("chemical formula", "formula", "compound"), FORMULAS, names=("formula", "compound", "chemical_formula"),
         says=("of {v}", "for {v}")),
    num("mass_g", ("mass", "sample mass"), 0.1, 1000, dp=2, unit="grams", names=("mass", "mass_grams", "grams")),
    num("molar_mass", ("molar mass",), 1, 400, dp=2, unit="grams per mole", names=("molar_mass", "mm", "molecular_weight")),
    num("h_conc", ("hydrogen ion concentration", "H+ concentration"), 0.0001, 0.1, dp=4, unit="moles per liter",
        names=("concentration", "h_concentration", "h_ion")),
    num("moles", ("amount of substance", "number of moles"), 0.1, 20, dp=2, unit="moles", names=("moles", "n", "amount")),
    num("temp_k", ("temperature",), 200, 600, dp=1, unit="kelvin", names=("temperature", "temp", "t", "kelvin")),
    text("element", ("element", "chemical element"), ELEMENTS, names=("element", "element_name", "name"),
         says=("for {v}", "about {v}")),
    choice("element_prop", ("property", "attribute"), ("atomic_number", "atomic_mass", "symbol", "electronegativity",
                                                       "melting_point"),
           names=("property", "attribute", "field"), says=("specifically its {v}",), default="atomic_mass"),
    num("conc1", ("initial concentration", "stock concentration"), 0.1, 18, dp=2, unit="molar",
        names=("initial_concentration", "c1", "stock_concentration")),
    num("vol1", ("initial volume", "stock volume"), 1, 500, dp=1, unit="milliliters", names=("initial_volume", "v1")),
    num("vol2", ("final volume", "target volume"), 10, 2000, dp=1, unit="milliliters", names=("final_volume", "v2")),
    num("amount_g", ("initial amount", "starting amount"), 1, 1000, dp=1, unit="grams",
        names=("initial_amount", "n0", "amount")),
    num("half_life", ("half-life",), 0.5, 5000, dp=1, unit="years", names=("half_life", "t_half", "halflife")),
    num("elapsed", ("elapsed time", "time passed"), 0.5, 20000, dp=1, unit="years", names=("time", "elapsed", "t")),
    num("specific_heat", ("specific heat", "specific heat capacity"), 0.1, 4.2, dp=3, unit="joules per gram kelvin",
        names=("specific_heat", "c", "heat_capacity")),
    num("delta_t", ("temperature change",), 1, 150, dp=1, unit="degrees", names=("temperature_change", "delta_t", "dt")),
    num("volume_sol", ("solution volume", "volume of solution"), 0.05, 10, dp=2, unit="liters",
        names=("volume", "liters", "solution_volume")),
    text("compound_name", ("compound", "substance"), COMPOUNDS, names=("compound", "substance", "name")),
    num("pressure_atm", ("pressure",), 0.1, 10, dp=2, unit="atmospheres", names=("pressure", "p", "atm"), default=1.0),
    # statistics
    nums("numbers", ("numbers", "values", "data points"), 0, 100, size=(3, 8), names=("numbers", "data", "values", "nums")),
    nums("measurements", ("measurements", "observations", "samples"), 0, 100, dp=1, size=(3, 7),
         names=("data", "values", "measurements", "samples")),
    flag("sample_sd", ("sample mode",), ("treating the data as a sample", "using the sample formula"),
         ("treating the data as the whole population", "using the population formula"),
         names=("sample", "is_sample", "use_sample")),
    whole("pct_rank", ("percentile",), 1, 99, names=("percentile", "p", "q"), says=("for percentile {v}", "at percentile {v}")),
    nums("x_values", ("x values", "first variable"), 0, 50, size=(4, 7), names=("x", "x_values", "xs")),
    nums("y_values", ("y values", "second variable"), 0, 50, size=(4, 7), names=("y", "y_values", "ys")),
    num("score", ("value", "score", "observation"), 0, 200, dp=1, names=("value", "x", "score")),
    num("mean", ("mean", "average"), 0, 150, dp=1, names=("mean", "mu", "average")),
    num("std_dev", ("standard deviation",), 0.5, 30, dp=2, names=("std_dev", "sigma", "sd", "stdev")),
    whole("trials", ("number of trials", "trials"), 2, 100, names=("trials", "n", "num_trials"), says=("in {v} trials",)),
    whole("successes", ("number of successes", "successes"), 0, 30, names=("successes", "k", "num_successes"),
          says=("exactly {v} successes", "getting {v} successes")),
    num("prob", ("success probability", "probability"), 0.05, 0.95, dp=2, names=("probability", "p", "prob")),
    whole("sample_n", ("sample size",), 5, 5000, names=("sample_size", "n", "size")),
    choice("conf_level", ("confidence level",), ("0.90", "0.95", "0.99"), names=("confidence", "confidence_level", "level"),
           says=("at the {v} confidence level",), default="0.95"),
    num("alpha", ("significance level", "alpha"), 0.01, 0.1, dp=2, names=("alpha", "significance", "significance_level"),
        default=0.05),
    nums("group_a", ("first sample", "group A scores"), 10, 100, size=(4, 7), names=("sample1", "group_a", "a")),
    nums("group_b", ("second sample", "group B scores"), 10, 100, size=(4, 7), names=("sample2", "group_b", "b")),
    num("x_new", ("new x value", "input value"), 0, 60, dp=1, names=("x_new", "x", "predict_at"), says=("at x = {v}", "for x = {v}")),
    whole("dice_sides", ("number of faces", "die size"), 4, 20, names=("sides", "faces", "die_sides"),
          says=("on a {v}-sided die",), default=6),
    whole("target_sum", ("target sum", "total"), 2, 30, names=("target", "sum", "target_sum")),
    whole("n_dice", ("number of dice", "dice count"), 1, 5, names=("dice", "num_dice", "n"), says=("with {v} dice", "rolling {v} dice"),
          default=2),
    # unit conversion
    num("quantity", ("value", "quantity", "amount"), 0.1, 5000, dp=2, names=("value", "quantity", "amount")),
    choice("len_from", ("source unit", "unit to convert from"), ("meters", "kilometers", "miles", "feet", "inches", "yards",
                                                               "centimeters"),
           names=("from_unit", "source_unit", "from"), says=("from {v}",)),
    choice("len_to", ("target unit", "unit to convert to"), ("meters", "kilometers", "miles", "feet", "inches", "yards",
                                                           "centimeters"),
           names=("to_unit", "target_unit", "to"), says=("to {v}", "into {v}")),
    num("temp_value", ("temperature",), -50, 250, dp=1, names=("temperature", "value", "temp")),
    choice("scale_from", ("source scale", "scale to convert from"), ("celsius", "fahrenheit", "kelvin"),
           names=("from_scale", "from_unit", "source")),
    choice("scale_to", ("target scale", "scale to convert to"), ("celsius", "fahrenheit", "kelvin"),
           names=("to_scale", "to_unit", "target")),
    choice("mass_from", ("source unit",), ("kilograms", "grams", "pounds", "ounces", "stones", "tonnes"),
           names=("from_unit", "source_unit", "from")),
    choice("mass_to", ("target unit",), ("kilograms", "grams", "pounds", "ounces", "stones", "tonnes"),
           names=("to_unit", "target_unit", "to")),
    choice("vol_from", ("source unit",), ("liters", "milliliters", "gallons", "quarts", "pints", "cups"),
           names=("from_unit", "source_unit", "from")),
    choice("vol_to", ("target unit",), ("liters", "milliliters", "gallons", "quarts", "pints", "cups"),
           names=("to_unit", "target_unit", "to")),
    choice("speed_from", ("source unit",), ("km/h", "mph", "m/s", "knots"), names=("from_unit", "from", "source_unit")),
    choice("speed_to", ("target unit",), ("km/h", "mph", "m/s", "knots"), names=("to_unit", "to", "target_unit")),
    choice("area_from", ("source unit",), ("square meters", "square feet", "acres", "hectares"),
           names=("from_unit", "from", "source_unit")),
    choice("area_to", ("target unit",), ("square meters", "square feet", "acres", "hectares"),
           names=("to_unit", "to", "target_unit")),
    choice("time_from", ("source unit",), ("seconds", "minutes", "hours", "days", "weeks"),
           names=("from_unit", "from", "source_unit")),
    choice("time_to", ("target unit",), ("seconds", "minutes", "hours", "days", "weeks"),
           names=("to_unit", "to", "target_unit")),
    choice("data_from", ("source unit",), ("bytes", "kilobytes", "megabytes", "gigabytes", "terabytes"),
           names=("from_unit", "from", "source_unit")),
    choice("data_to", ("target unit",), ("bytes", "kilobytes", "megabytes", "gigabytes", "terabytes"),
           names=("to_unit", "to", "target_unit")),
    choice("energy_from", ("source unit",), ("joules", "calories", "kilowatt-hours", "BTU"),
           names=("from_unit", "from", "source_unit")),
    choice("energy_to", ("target unit",), ("joules", "calories", "kilowatt-hours", "BTU"),
           names=("to_unit", "to", "target_unit")),
    whole("round_to", ("decimal places", "rounding"), 0, 6, names=("round_to", "decimals", "precision"),
          says=("rounded to {v} decimal places",), default=2),
    # geography
    text("country", ("country",), COUNTRIES, names=("country", "country_name", "nation"), says=("of {v}", "for {v}", "in {v}")),
    text("city", ("city", "location"), CITIES, names=("city", "location", "city_name"), says=("in {v}", "for {v}")),
    text("city_a", ("origin city", "first city", "starting city"), CITIES, names=("city1", "origin", "from_city", "start"),
         says=("from {v}",)),
    text("city_b", ("destination city", "second city"), CITIES, names=("city2", "destination", "to_city", "end"),
         says=("to {v}",)),
    choice("dist_unit", ("distance unit", "unit"), ("km", "miles"), names=("unit", "units", "distance_unit"),
           says=("in {v}",), default="km"),
    whole("limit", ("result limit", "maximum number of results", "number of results"), 1, 25,
          names=("limit", "max_results", "top_n", "count"), says=("limited to {v} results", "showing the top {v}"),
          default=5),
    text("river", ("river",), RIVERS, names=("river", "river_name", "name")),
    whole("census_year", ("year",), 1950, 2024, names=("year", "census_year"), says=("in {v}", "as of {v}"), default=2024),
    # weather
    choice("units", ("unit system", "units"), ("metric", "imperial"), names=("units", "unit_system", "unit"),
           says=("in {v} units", "using {v} units"), default="metric"),
    whole("forecast_days", ("number of days", "forecast length"), 1, 14, unit="days", names=("days", "num_days", "forecast_days"),
          says=("for the next {v} days", "over the next {v} days")),
    flag("hourly", ("hourly breakdown",), ("with an hourly breakdown", "including hourly details"),
         ("without the hourly breakdown", "with daily values only"), names=("include_hourly", "hourly", "detailed")),
    text("day", ("date", "day"), gen=date, names=("date", "day", "on_date"), says=("on {v}", "for {v}")),
    choice("pollutant", ("pollutant",), ("pm25", "pm10", "ozone", "no2"), names=("pollutant", "metric"),
           says=("for {v}",), default="pm25"),
    # sports
    choice("league", ("league",), LEAGUES, names=("league", "competition", "league_name"), says=("in the {v}", "for the {v}")),
    whole("season", ("season", "season year"), 2005, 2024, names=("season", "year", "season_year"), says=("in the {v} season", "for the {v} season")),
    text("player", ("player", "athlete", "player name"), gen=person, names=("player", "player_name", "athlete", "name")),
    text("team", ("team", "team name"), TEAMS, names=("team", "team_name", "club")),
    text("home_team", ("home team",), TEAMS, names=("home_team", "team1", "home")),
    text("away_team", ("away team", "visiting team"), TEAMS, names=("away_team", "team2", "away")),
    whole("n_games", ("number of games", "game count"), 1, 20, names=("num_games", "games", "limit", "count"),
          says=("for the next {v} games",), default=5),
    choice("stat_type", ("statistic", "stat category"), ("points", "assists", "rebounds", "goals", "all"),
           names=("stat", "stat_type", "category"), says=("for {v}",), default="all"),
    whole("hits", ("hits", "number of hits"), 0, 250, names=("hits", "h")),
    whole("at_bats", ("at bats", "number of at bats"), 10, 700, names=("at_bats", "ab")),
    choice("sport", ("sport",), ("tennis", "golf", "chess", "badminton", "table tennis"), names=("sport", "game"),
           says=("in {v}",)),
    text("tournament", ("tournament", "competition"), TOURNAMENTS, names=("tournament", "event", "competition")),
    whole("goals_for", ("goals scored",), 0, 120, names=("goals_for", "scored", "gf")),
    whole("goals_against", ("goals conceded",), 0, 120, names=("goals_against", "conceded", "ga")),
    # music
    text("artist", ("artist", "singer", "band"), gen=person, names=("artist", "artist_name", "performer")),
    choice("genre", ("genre", "music genre"), ("rock", "pop", "jazz", "classical", "hip hop", "country", "blues",
                                               "electronic"),
           names=("genre", "music_genre", "style"), says=("in the {v} genre",), default="pop"),
    text("song", ("song", "song title", "track"), gen=title, names=("song", "title", "song_title", "track")),
    text("album", ("album", "album title"), gen=title, names=("album", "album_title", "title")),
    text("playlist_name", ("playlist name", "name"), gen=title, names=("name", "playlist_name", "title")),
    texts("songs", ("songs", "tracks"), gen=title, names=("songs", "tracks", "song_list")),
    flag("public", ("visibility",), ("as a public playlist", "visible to everyone"), ("as a private playlist", "only visible to me"),
         names=("public", "is_public", "shared")),
    text("note", ("note", "musical note"), NOTES, names=("note", "pitch", "note_name")),
    num("tuning", ("reference pitch", "tuning"), 415, 466, dp=1, unit="hertz", names=("tuning", "reference", "a4"),
        says=("with A4 tuned to {v} hertz",), default=440.0),
    choice("root", ("root note", "key"), ("C", "D", "E", "F", "G", "A", "B"), names=("root", "key", "root_note")),
    choice("chord_type", ("chord quality", "chord type"), ("major", "minor", "diminished", "augmented", "seventh"),
           names=("quality", "chord_type", "type"), default="major"),
    whole("bpm", ("tempo", "beats per minute"), 40, 220, unit="BPM", names=("bpm", "tempo", "beats_per_minute")),
    whole("beats", ("number of beats", "beats"), 1, 512, names=("beats", "num_beats", "count")),
    text("instrument", ("instrument",), INSTRUMENTS, names=("instrument", "instrument_name")),
    # cooking
    text("dish", ("dish", "recipe", "meal"), DISHES, names=("dish", "recipe", "query", "dish_name")),
    choice("diet", ("dietary restriction", "diet"), ("none", "vegetarian", "vegan", "gluten-free", "keto", "dairy-free"),
           names=("diet", "dietary_restriction", "restriction"), says=("that is {v}", "suitable for a {v} diet"),
           default="none"),
    whole("max_minutes", ("maximum cooking time", "time limit"), 10, 180, unit="minutes",
          names=("max_time", "max_minutes", "time_limit"), says=("that takes at most {v} minutes", "under {v} minutes"),
          default=60),
    texts("ingredients", ("ingredients",), INGREDIENTS, size=(2, 5), names=("ingredients", "items", "available_ingredients")),
    whole("servings_from", ("original servings", "current servings"), 1, 12, names=("original_servings", "servings", "from_servings"),
          default=1),
    whole("servings_to", ("desired servings", "target servings"), 1, 40, names=("desired_servings", "target_servings", "to_servings"),
          says=("for {v} people", "to serve {v}")),
    text("food", ("food", "food item"), FOODS, names=("food", "item", "food_name", "ingredient")),
    whole("serving_g", ("serving size", "portion size"), 10, 500, unit="grams", names=("serving_size", "grams", "portion"),
          says=("per {v} grams", "for a {v} gram serving"), default=100),
    num("weight_kg", ("weight",), 0.3, 12, dp=2, unit="kilograms", names=("weight", "weight_kg", "kg")),
    text("ingredient", ("ingredient",), INGREDIENTS, names=("ingredient", "item", "ingredient_name"), says=("for {v}",)),
    choice("cook_from", ("source unit",), ("cups", "tablespoons", "teaspoons", "milliliters", "grams", "ounces"),
           names=("from_unit", "from", "source_unit")),
    choice("cook_to", ("target unit",), ("cups", "tablespoons", "teaspoons", "milliliters", "grams", "ounces"),
           names=("to_unit", "to", "target_unit")),
    choice("doneness", ("doneness",), ("rare", "medium rare", "medium", "well done"), names=("doneness", "level"),
           default="medium"),
    choice("meat", ("meat", "cut"), ("beef", "pork", "lamb", "chicken", "turkey"), names=("meat", "protein", "cut")),
    # travel
    choice("origin_code", ("origin airport", "departure airport"), AIRPORTS, names=("origin", "from_airport", "departure", "source")),
    choice("dest_code", ("destination airport", "arrival airport"), AIRPORTS, names=("destination", "to_airport", "arrival", "dest")),
    text("travel_date", ("travel date", "departure date", "date"), gen=date, names=("date", "departure_date", "travel_date"),
         says=("on {v}", "departing {v}")),
    whole("passengers", ("number of passengers", "travellers"), 1, 9, names=("passengers", "adults", "num_passengers"),
          says=("for {v} passengers", "for {v} people"), default=1),
    choice("cabin", ("cabin class", "class"), ("economy", "premium economy", "business", "first"),
           names=("cabin_class", "cabin", "class"), says=("in {v} class",), default="economy"),
    text("checkin", ("check-in date", "arrival date"), gen=date, names=("check_in", "checkin_date", "start_date"),
         says=("checking in on {v}", "from {v}")),
    whole("nights", ("number of nights", "stay length"), 1, 21, unit="nights", names=("nights", "num_nights", "duration"),
          says=("for {v} nights",)),
    whole("rooms", ("number of rooms",), 1, 5, names=("rooms", "num_rooms"), says=("with {v} rooms",), default=1),
    num("max_price", ("maximum price", "budget", "price limit"), 50, 900, dp=0, unit="dollars",
        names=("max_price", "budget", "price_limit"), says=("under {v} dollars", "for at most {v} dollars")),
    num("min_rating", ("minimum rating",), 1, 5, dp=1, names=("min_rating", "rating", "stars"),
        says=("rated at least {v}", "with a rating of {v} or more"), default=3.0),
    whole("rental_days", ("number of rental days", "rental length"), 1, 30, unit="days", names=("days", "rental_days", "duration")),
    choice("car_type", ("car type", "vehicle class"), ("compact", "sedan", "suv", "minivan", "convertible"),
           names=("car_type", "vehicle_type", "category"), says=("a {v}",), default="compact"),
    text("citizenship", ("citizenship", "passport country", "nationality"), COUNTRIES,
         names=("citizenship", "passport_country", "nationality")),
    text("destination_country", ("destination country", "destination"), COUNTRIES,
         names=("destination", "destination_country", "country")),
    whole("travellers", ("number of travellers", "group size"), 1, 8, names=("travelers", "people", "group_size"),
          says=("for {v} travellers", "for a group of {v}")),
    whole("trip_days", ("trip length", "number of days"), 1, 30, unit="days", names=("days", "duration", "trip_length")),
    choice("budget_level", ("budget level", "travel style"), ("budget", "mid-range", "luxury"),
           names=("budget_level", "style", "tier"), says=("on a {v} budget",), default="mid-range"),
    choice("attraction_type", ("category", "attraction type"), ("museums", "parks", "landmarks", "restaurants",
                                                                "nightlife", "beaches"),
           names=("category", "type", "attraction_type"), default="landmarks"),
    # health
    num("body_kg", ("weight", "body weight"), 35, 160, dp=1, unit="kilograms", names=("weight", "weight_kg", "mass")),
    num("height_cm", ("height",), 140, 210, dp=1, unit="centimeters", names=("height", "height_cm")),
    num("height_m2", ("height",), 1.4, 2.1, dp=2, unit="meters", names=("height", "height_m", "meters")),
    whole("age", ("age",), 18, 90, unit="years", names=("age", "age_years"), says=("aged {v}", "at age {v}")),
    choice("sex", ("sex", "gender"), ("male", "female"), names=("gender", "sex")),
    choice("activity", ("activity", "exercise"), ("running", "cycling", "swimming", "walking", "rowing", "yoga"),
           names=("activity", "exercise", "sport")),
    whole("minutes", ("duration", "time spent"), 5, 240, unit="minutes", names=("duration", "minutes", "time"),
          says=("for {v} minutes",)),
    choice("activity_level", ("activity level",), ("sedentary", "light", "moderate", "active", "very active"),
           names=("activity_level", "level", "lifestyle"), says=("with a {v} lifestyle",), default="moderate"),
    num("intensity", ("intensity", "exercise intensity"), 0.5, 0.9, dp=2, names=("intensity", "effort"), default=0.7),
    text("drug", ("medication", "drug"), DRUGS, names=("drug", "medication", "medicine")),
    texts("symptoms", ("symptoms",), SYMPTOMS, size=(1, 4), names=("symptoms", "symptom_list")),
    text("bedtime", ("bedtime", "time to sleep"), gen=clock, names=("bedtime", "sleep_time", "start_time"),
         says=("going to bed at {v}", "at {v}")),
    whole("sleep_cycles", ("number of sleep cycles", "cycles"), 3, 7, names=("cycles", "num_cycles"), default=5),
    text("last_period", ("date of the last period", "last menstrual period"), gen=date,
         names=("last_period_date", "lmp", "date")),
    whole("steps", ("step count", "number of steps"), 500, 30000, names=("steps", "step_count")),
    num("stride_m", ("stride length",), 0.5, 1.0, dp=2, unit="meters", names=("stride_length", "stride"), default=0.75),
    # astronomy
    text("planet", ("planet",), PLANETS, names=("planet", "planet_name", "body")),
    text("planet_b", ("second planet", "other planet"), PLANETS, names=("planet2", "to_planet", "target")),
    choice("planet_prop", ("property", "attribute"), ("mass", "radius", "gravity", "moons", "day_length"),
           names=("property", "attribute", "field"), says=("especially its {v}",), default="mass"),
    text("star", ("star",), STARS, names=("star", "star_name", "name")),
    num("axis_au", ("semi-major axis", "orbital distance"), 0.2, 50, dp=2, unit="astronomical units",
        names=("semi_major_axis", "distance_au", "a")),
    num("earth_masses", ("mass", "planet mass"), 0.05, 400, dp=2, unit="Earth masses", names=("mass", "mass_earths", "m")),
    num("earth_radii", ("radius", "planet radius"), 0.2, 12, dp=2, unit="Earth radii", names=("radius", "radius_earths", "r")),
    num("light_years", ("distance",), 0.5, 5000, dp=1, unit="light years", names=("distance", "light_years", "ly")),
    num("dist_km", ("distance",), 1000, 900000000, dp=0, unit="kilometers", names=("distance", "distance_km", "km")),
    choice("eclipse_type", ("eclipse type",), ("solar", "lunar", "any"), names=("type", "eclipse_type", "kind"),
           says=("for a {v} eclipse",), default="any"),
    whole("pass_days", ("number of days", "search window"), 1, 10, unit="days", names=("days", "window"),
          says=("within the next {v} days",), default=3),
    # biology
    text("sequence", ("DNA sequence", "sequence"), gen=dna, names=("sequence", "dna", "dna_sequence", "seq")),
    flag("reverse", ("reverse order",), ("as the reverse complement", "reversed as well"),
         ("without reversing it", "keeping the original direction"), names=("reverse", "reverse_complement")),
    text("protein", ("protein",), PROTEINS, names=("protein", "protein_name", "name")),
    text("animal", ("species", "animal"), ANIMALS, names=("species", "animal", "name")),
    whole("pop0", ("initial population", "starting population"), 10, 100000, names=("initial_population", "n0", "population")),
    num("growth", ("growth rate", "annual growth rate"), 0.01, 0.5, dp=3, names=("growth_rate", "r", "rate")),
    whole("gens", ("number of generations", "generations"), 1, 30, names=("generations", "n", "cycles"),
          says=("after {v} generations", "over {v} generations")),
    whole("cells0", ("initial cell count", "starting cells"), 1, 1000, names=("initial_cells", "cells", "n0"), default=1),
    num("allele_p", ("allele frequency", "dominant allele frequency"), 0.05, 0.95, dp=2, names=("p", "allele_frequency", "freq")),
    choice("genotype1", ("first parent's genotype",), GENOTYPES, names=("parent1", "genotype1", "mother")),
    choice("genotype2", ("second parent's genotype",), GENOTYPES, names=("parent2", "genotype2", "father")),
    choice("habitat", ("habitat",), ("forest", "ocean", "desert", "grassland", "tundra", "wetland"),
           names=("habitat", "biome", "environment")),
    # history
    text("event", ("historical event", "event"), EVENTS, names=("event", "event_name", "query")),
    text("figure", ("historical figure", "person"), FIGURES, names=("name", "person", "figure")),
    whole("hist_year", ("year",), 1000, 1999, names=("year", "date_year"), says=("in {v}", "during {v}")),
    choice("region", ("region",), ("Europe", "Asia", "Africa", "Americas", "Oceania", "world"), names=("region", "area", "continent"),
           says=("in {v}",), default="world"),
    whole("start_year", ("start year", "first year"), 1000, 1900, names=("start_year", "from_year", "start"), says=("from {v}",)),
    whole("end_year", ("end year", "last year"), 1901, 2000, names=("end_year", "to_year", "end"), says=("to {v}", "until {v}")),
    text("war", ("war", "conflict"), WARS, names=("war", "conflict", "name")),
    whole("decade", ("decade", "first year of the decade"), 1800, 1990, step=10, names=("decade", "decade_start", "start_year"),
          says=("from the {v}s", "in the {v}s")),
    num("c14", ("remaining carbon-14", "carbon-14 fraction"), 0.05, 0.95, dp=2, names=("remaining_fraction", "c14_ratio", "fraction")),
    # law
    text("law_topic", ("legal topic", "subject", "keywords"), LAW_TOPICS, names=("topic", "keywords", "query", "subject")),
    text("jurisdiction", ("jurisdiction", "state"), US_STATES, names=("jurisdiction", "state", "court_state"),
         says=("in {v}", "under {v} law")),
    whole("since_year", ("start year", "earliest year"), 1950, 2024, names=("since", "from_year", "year_from"),
          says=("since {v}", "from {v} onwards"), default=2000),
    text("case_no", ("case number", "docket number"), gen=case_number, names=("case_number", "docket", "case_id")),
    text("case_title", ("case", "case name"), gen=case_name, names=("case_name", "case", "title")),
    choice("claim", ("claim type", "type of claim"), ("personal injury", "contract", "property damage", "fraud", "defamation"),
           names=("claim_type", "claim", "case_type")),
    choice("specialty", ("practice area", "specialty"), ("family", "criminal", "immigration", "employment", "tax", "patent"),
           names=("specialty", "practice_area", "area")),
    whole("hours", ("number of hours", "billable hours"), 1, 200, unit="hours", names=("hours", "billable_hours")),
    num("hourly_rate", ("hourly rate",), 50, 900, dp=0, unit="dollars", names=("hourly_rate", "rate")),
    flag("include_closed", ("closed cases",), ("including closed cases", "with closed cases included"),
         ("only open cases", "excluding closed cases"), names=("include_closed", "closed", "all_cases")),
    # real estate
    num("home_price", ("home price", "property price", "purchase price"), 80000, 2000000, dp=0, unit="dollars",
        names=("home_price", "price", "property_price")),
    num("max_home_price", ("maximum price", "budget", "price limit"), 100000, 3000000, dp=0, unit="dollars",
        names=("max_price", "budget", "price_limit"), says=("under {v} dollars", "for at most {v} dollars")),
    num("down_payment", ("down payment",), 5000, 400000, dp=0, unit="dollars", names=("down_payment", "deposit")),
    text("street_address", ("address", "street address"), gen=address, names=("address", "street_address", "location")),
    whole("bedrooms", ("number of bedrooms", "bedrooms"), 1, 6, names=("bedrooms", "beds", "num_bedrooms"),
          says=("with {v} bedrooms",), default=3),
    whole("min_beds", ("minimum number of bedrooms", "minimum bedrooms"), 1, 6, names=("min_bedrooms", "bedrooms", "min_beds"),
          says=("with at least {v} bedrooms",), default=1),
    choice("property_type", ("property type",), ("house", "apartment", "condo", "townhouse"), names=("property_type", "type"),
           says=("only {v} listings",), default="house"),
    num("annual_rent", ("annual rent", "yearly rental income"), 5000, 120000, dp=0, unit="dollars",
        names=("annual_rent", "rent", "rental_income")),
    num("assessed", ("assessed value",), 50000, 3000000, dp=0, unit="dollars", names=("assessed_value", "value")),
    whole("sqft", ("floor area", "size"), 300, 8000, unit="square feet", names=("square_feet", "area", "sqft")),
    num("income", ("annual income", "yearly salary"), 20000, 400000, dp=0, unit="dollars",
        names=("annual_income", "income", "salary")),
    num("debts", ("monthly debts", "monthly debt payments"), 0, 5000, dp=0, unit="dollars",
        names=("monthly_debts", "debts", "debt_payments")),
    text("zip", ("zip code", "postal code"), gen=zip_code, names=("zip_code", "zip", "postal_code")),
    # date and time
    text("date_a", ("start date", "first date"), gen=date, names=("start_date", "date1", "from_date", "start"),
         says=("from {v}", "starting {v}")),
    text("date_b", ("end date", "second date"), gen=date, names=("end_date", "date2", "to_date", "end"),
         says=("to {v}", "until {v}")),
    text("some_date", ("date",), gen=date, names=("date", "day", "input_date")),
    whole("days_delta", ("number of days",), 1, 1000, names=("days", "n_days", "offset"), says=("plus {v} days", "moving {v} days ahead")),
    choice("tz", ("timezone", "time zone"), TIMEZONES, names=("timezone", "tz", "zone"), says=("in {v}",)),
    choice("tz_from", ("source timezone",), TIMEZONES, names=("from_tz", "from_timezone", "source_tz")),
    choice("tz_to", ("target timezone",), TIMEZONES, names=("to_tz", "to_timezone", "target_tz")),
    text("clock_time", ("time",), gen=clock, names=("time", "clock_time", "hhmm"), says=("at {v}",)),
    text("birth_date", ("date of birth", "birthday"), gen=past_date, names=("birth_date", "dob", "birthday"),
         says=("born on {v}",)),
    text("ref_date", ("reference date", "as-of date"), gen=date, names=("reference_date", "as_of", "on_date"),
         says=("as of {v}", "on {v}"), default="today"),
    whole("cal_year", ("year",), 1600, 2400, names=("year", "yr")),
    text("holiday_country", ("country",), COUNTRIES, names=("country", "country_code", "region"), says=("in {v}",),
         default="United States"),
    # text utilities
    text("input_text", ("text", "string", "input"), gen=phrase, names=("text", "string", "s", "input"), quote=True),
    text("word", ("word",), WORDS, names=("word", "term", "query")),
    text("maybe_palindrome", ("word", "text", "string"), PALINDROMES + WORDS, names=("text", "word", "s", "string"), quote=True),
    choice("case", ("case", "target case"), ("upper", "lower", "title", "snake", "camel"), names=("case", "style", "target_case"),
           says=("to {v} case", "in {v} case")),
    text("substring", ("substring", "pattern"), _PHRASE_WORDS, names=("substring", "pattern", "sub", "needle"), quote=True),
    text("old_word", ("word to replace", "old word"), _PHRASE_WORDS, names=("old", "target", "find"), quote=True),
    text("new_word", ("replacement", "new word"), WORDS, names=("new", "replacement", "replace_with"), quote=True),
    whole("max_len", ("maximum length", "character limit"), 5, 40, unit="characters", names=("max_length", "limit", "length")),
    text("suffix", ("suffix", "ending"), ("more", "etc", "cont", "read more"), names=("suffix", "ellipsis", "ending"), quote=True,
         default="..."),
    whole("shift", ("shift", "key"), 1, 25, names=("shift", "key", "offset"), says=("with a shift of {v}", "shifted by {v}")),
    flag("ignore_case", ("case sensitivity",), ("ignoring case", "case-insensitively"), ("case-sensitively", "respecting case"),
         names=("ignore_case", "case_insensitive"), default=True),
    text("text_a", ("first string", "first word"), WORDS, names=("s1", "string1", "word1", "a"), quote=True),
    text("text_b", ("second string", "second word"), WORDS, names=("s2", "string2", "word2", "b"), quote=True),
    choice("separator", ("separator", "word separator"), ("hyphen", "underscore", "dot"), names=("separator", "sep", "delimiter"),
           says=("using a {v} between words", "with {v} separators"), default="hyphen"),
    # movies and tv
    choice("movie_genre", ("genre", "film genre"), ("action", "comedy", "drama", "horror", "sci-fi", "romance", "animation",
                                                    "documentary"),
           names=("genre", "category")),
    whole("release_year", ("release year", "year"), 1970, 2025, names=("year", "release_year"), says=("from {v}", "released in {v}"),
          default=2024),
    num("min_score", ("minimum rating", "minimum score"), 1, 9.5, dp=1, names=("min_rating", "rating", "min_score"),
        says=("rated {v} or higher", "with a rating of at least {v}"), default=7.0),
    text("movie", ("movie", "film", "movie title"), gen=title, names=("title", "movie", "movie_title", "film")),
    text("actor", ("actor", "actress", "performer"), gen=person, names=("actor", "name", "actor_name")),
    text("series", ("series", "TV show", "show"), gen=title, names=("series", "show", "title")),
    whole("season_no", ("season", "season number"), 1, 12, names=("season", "season_number")),
    whole("episode_no", ("episode", "episode number"), 1, 24, names=("episode", "episode_number", "ep")),
    whole("rec_count", ("number of recommendations", "how many suggestions"), 1, 15, names=("count", "limit", "n"),
          says=("give me {v} suggestions",), default=5),
    # shopping
    text("product_query", ("product", "search query", "item"), PRODUCTS, names=("query", "product", "keyword", "item")),
    choice("sort_by", ("sort order", "sorting"), ("relevance", "price", "rating", "newest"), names=("sort_by", "sort", "order"),
           says=("sorted by {v}",), default="relevance"),
    whole("discount_pct", ("discount", "discount percentage"), 5, 80, unit="percent", names=("discount", "discount_percent", "percent_off"),
          says=("with {v} percent off", "at {v} percent off")),
    text("order", ("order", "order number", "order id"), gen=order_id, names=("order_id", "order_number", "id")),
    num("parcel_kg", ("parcel weight", "package weight"), 0.1, 30, dp=1, unit="kilograms", names=("weight", "weight_kg", "package_weight")),
    flag("express", ("express shipping",), ("with express shipping", "shipped express"), ("with standard shipping", "using regular shipping"),
         names=("express", "expedited", "fast_shipping")),
    text("sku", ("product id", "item code", "SKU"), gen=sku, names=("product_id", "sku", "item_id")),
    whole("cart_qty", ("quantity", "number of units"), 1, 20, names=("quantity", "qty", "count"), says=("in a quantity of {v}", "with a quantity of {v}"),
          default=1),
    text("coupon", ("coupon code", "promo code"), ("SAVE10", "WELCOME", "SPRING25", "FREESHIP", "VIP2024"),
         names=("coupon", "promo_code", "code")),
    # computing
    whole("int_value", ("number", "integer"), 1, 100000, names=("number", "value", "n", "decimal")),
    choice("numeral_base", ("target base", "base"), ("binary", "octal", "hexadecimal"), names=("base", "target_base", "format"),
           says=("to {v}", "in {v}")),
    choice("hash_algo", ("hash algorithm", "algorithm"), ("md5", "sha1", "sha256", "sha512"), names=("algorithm", "algo", "hash_type"),
           says=("using {v}", "with {v}"), default="sha256"),
    whole("pw_len", ("length", "password length"), 8, 64, unit="characters", names=("length", "size", "num_chars"),
          says=("{v} characters long", "with {v} characters")),
    flag("symbols", ("symbols", "special characters"), ("with symbols", "including special characters"),
         ("without symbols", "with letters and digits only"), names=("include_symbols", "symbols", "special_chars"), default=True),
    text("ip", ("IP address", "address"), gen=ip_address, names=("ip", "ip_address", "address")),
    num("file_gb", ("file size",), 0.1, 200, dp=1, unit="gigabytes", names=("file_size", "size_gb", "size")),
    num("speed_mbps", ("connection speed", "bandwidth"), 1, 1000, dp=1, unit="megabits per second",
        names=("speed", "bandwidth", "mbps")),
    text("email_addr", ("email address", "email"), gen=email, names=("email", "address", "email_address")),
    text("long_url", ("URL", "link", "web address"), gen=url, names=("url", "link", "long_url")),
    whole("rand_min", ("minimum", "lower bound"), 0, 50, names=("min", "low", "minimum", "start")),
    whole("rand_max", ("maximum", "upper bound"), 51, 1000, names=("max", "high", "maximum", "end")),
    whole("rand_count", ("how many numbers", "count"), 1, 10, names=("count", "n", "how_many"), says=("producing {v} numbers", "with a count of {v}"), default=1),
    text("color", ("color", "hex color"), gen=hex_color, names=("color", "hex", "hex_code")),
    # language
    text("sentence", ("text", "sentence", "phrase"), gen=phrase, names=("text", "sentence", "phrase", "q"), quote=True),
    choice("target_lang", ("target language", "language"), LANGUAGES, names=("target_language", "target", "to_lang", "lang"),
           says=("into {v}", "to {v}")),
    choice("source_lang", ("source language", "original language"), LANGUAGES, names=("source_language", "source", "from_lang"),
           says=("from {v}",), default="English"),
    whole("max_words", ("number of words", "word limit"), 1, 20, names=("limit", "max_results", "count"), says=("up to {v} of them",),
          default=5),
    # energy and environment
    choice("carbon_activity", ("activity", "emission source"), CARBON_ACTIVITIES, names=("activity", "source", "category")),
    num("activity_amount", ("amount", "distance or usage"), 1, 5000, dp=1, names=("amount", "quantity", "distance")),
    num("panel_watts", ("panel wattage", "panel rating"), 100, 600, dp=0, unit="watts", names=("panel_watts", "wattage", "rating")),
    num("sun_hours", ("peak sun hours", "hours of sunlight"), 1, 10, dp=1, unit="hours", names=("sun_hours", "peak_hours", "hours")),
    num("efficiency", ("system efficiency", "efficiency"), 0.5, 0.98, dp=2, names=("efficiency", "eta"), default=0.8),
    num("kwh", ("energy use", "consumption"), 1, 5000, dp=1, unit="kilowatt-hours", names=("kwh", "usage", "energy")),
    num("kwh_price", ("price per kilowatt-hour", "electricity rate"), 0.05, 0.6, dp=3, unit="dollars",
        names=("price_per_kwh", "rate", "tariff")),
    num("trip_km", ("trip distance", "distance"), 1, 3000, dp=1, unit="kilometers", names=("distance", "distance_km", "km")),
    num("fuel_eff", ("fuel consumption",), 3, 20, dp=1, unit="liters per 100 kilometers", names=("fuel_efficiency", "consumption", "l_per_100km")),
    num("fuel_price", ("fuel price", "price per liter"), 0.8, 3, dp=2, unit="dollars", names=("fuel_price", "price_per_liter", "price")),
    whole("trees", ("number of trees", "trees"), 1, 10000, names=("trees", "num_trees", "count")),
    whole("tree_years", ("number of years",), 1, 100, unit="years", names=("years", "duration"), says=("over {v} years",)),
]
PARAMS: dict[str, Param] = {p.key: p for p in _P}


# ---------------------------------------------------------------------------------------------
# Verb families and functions

@dataclass(frozen=True)
class Family:
    """How one kind of function is named, described and asked for."""

    name_verbs: tuple[str, ...]  # snake_case verbs for function names
    suffix: str  # noun suffix for names like ``bmi_calculator`` ("" = none)
    bare: bool  # whether the bare object is a fine name (``compound_interest``)
    verbs: tuple[str, ...]  # verbs the user says
    article: str  # between the user verb and the object ("the", "a" or "")
    docs: tuple[str, ...]  # description templates with {obj}
    asks: tuple[str, ...] = ()  # question stems with {obj}, for requests phrased as a question


FAMILIES: dict[str, Family] = {
    "calc": Family(("calculate", "compute", "calc", "get", "find"), "calculator", True,
                   ("calculate", "compute", "find", "work out", "determine", "figure out", "get"), "the",
                   ("Calculate the {obj}.", "Calculates the {obj} from the given inputs.", "Compute the {obj}.",
                    "Returns the {obj}.", "Computes the {obj} for the given values."),
                   ("What is the {obj}", "What's the {obj}")),
    "get": Family(("get", "fetch", "retrieve", "lookup", "query"), "info", True,
                  ("get", "fetch", "look up", "find", "retrieve", "check", "pull up"), "the",
                  ("Get the {obj}.", "Retrieves the {obj}.", "Fetch the {obj}.", "Look up the {obj}.",
                   "Returns the {obj} from the database."),
                  ("What is the {obj}", "What's the {obj}")),
    "search": Family(("search", "find", "list", "lookup"), "search", False,
                     ("search for", "find", "look up", "list", "get"), "",
                     ("Search for {obj}.", "Finds {obj} matching the given criteria.", "Returns a list of {obj}.",
                      "Search the catalogue of {obj}.")),
    "convert": Family(("convert", "transform"), "converter", False, ("convert", "change"), "",
                      ("Convert {obj}.", "Converts {obj} as requested.", "Conversion tool for {obj}.")),
    "check": Family(("check", "is", "validate", "verify", "test"), "checker", False, ("check", "verify"), "",
                    ("Check {obj}.", "Returns true if {obj}, false otherwise.", "Verifies {obj}.")),
    "make": Family(("create", "generate", "make", "build", "new"), "generator", False,
                   ("create", "generate", "make", "set up"), "a",
                   ("Create a {obj}.", "Generates a {obj}.", "Makes a new {obj} with the given settings.")),
    "book": Family(("book", "reserve"), "booking", False, ("book", "reserve"), "a",
                   ("Book a {obj}.", "Reserves a {obj}.", "Makes a {obj} reservation.")),
}


@dataclass(frozen=True)
class Func:
    """A function concept; its objects name it (objs[0] is the phrase users say)."""

    domain: str
    family: str
    objs: tuple[str, ...]
    params: tuple[str, ...]  # PARAMS keys; "?key" marks an optional parameter
    result: str = "number"  # "number" | "integer" | "bool" | "text:POOL" | "list:POOL"
    asks: tuple[str, ...] = ()  # intent phrases overriding "{verb} {article} {obj}"
    doc: tuple[str, ...] = ()  # descriptions overriding the family's
    snake: tuple[str, ...] = ()  # name objects overriding the snake_cased objs (verbs are added)
    full: tuple[str, ...] = ()  # complete names used as they are (``is_prime``)

    @property
    def key(self) -> str:
        return f"{self.domain}/{self.objs[0]}"


def F(domain: str, family: str, objs: str | tuple[str, ...], params: str, result: str = "number", *,
      asks: tuple[str, ...] = (), doc: tuple[str, ...] = (), snake: tuple[str, ...] = (),
      full: tuple[str, ...] = ()) -> Func:
    return Func(domain, family, _tup(objs), tuple(params.split()), result, asks, doc, snake, full)


FUNCS: list[Func] = [
    # math
    F("math", "calc", ("greatest common divisor", "gcd"), "int_a int_b", "integer"),
    F("math", "calc", ("least common multiple", "lcm"), "int_a int_b", "integer"),
    F("math", "calc", "factorial", "n_small", "integer"),
    F("math", "check", "prime number", "n_big", "bool",
      asks=("check whether a number is prime", "find out if a number is prime", "test a number for primality"),
      doc=("Check whether a number is prime.", "Returns true if the given integer is a prime number."),
      snake=("prime", "prime_number"), full=("is_prime",)),
    F("math", "get", "fibonacci sequence", "n_terms", "list:integers",
      asks=("list the first terms of the Fibonacci sequence", "generate the Fibonacci sequence")),
    F("math", "calc", "roots of a quadratic equation", "coef_a coef_b coef_c", "list:decimals",
      asks=("solve a quadratic equation", "find the roots of a quadratic equation"), snake=("quadratic_roots",)),
    F("math", "calc", "power of a number", "base_num exponent", snake=("power", "exponentiation")),
    F("math", "calc", "square root", "radicand ?precision"),
    F("math", "calc", "logarithm", "log_value ?log_base", snake=("logarithm", "log")),
    F("math", "calc", "number of permutations", "set_size pick_size", "integer", snake=("permutations",)),
    F("math", "calc", "number of combinations", "set_size pick_size", "integer", snake=("combinations", "binomial_coefficient")),
    F("math", "get", "prime factors", "n_big", "list:integers", snake=("prime_factors",), full=("factorize", "prime_factorization")),
    F("math", "calc", "percentage of a number", "percent total_amount", snake=("percentage_of", "percent_of")),
    F("math", "calc", "derivative of a polynomial", "poly_coefs point_x", snake=("polynomial_derivative", "derivative")),
    F("math", "calc", "definite integral of a polynomial", "poly_coefs lower upper", snake=("polynomial_integral", "definite_integral")),
    F("math", "calc", "absolute value", "any_number", snake=("absolute_value", "abs")),
    # geometry
    F("geometry", "calc", "area of a circle", "radius", snake=("circle_area",)),
    F("geometry", "calc", "circumference of a circle", "radius", snake=("circle_circumference", "circumference")),
    F("geometry", "calc", "area of a rectangle", "length width", snake=("rectangle_area",)),
    F("geometry", "calc", "area of a triangle", "base_len height_geo", snake=("triangle_area",)),
    F("geometry", "calc", "hypotenuse", "side_a side_b", snake=("hypotenuse", "right_triangle_hypotenuse")),
    F("geometry", "calc", "volume of a sphere", "radius", snake=("sphere_volume",)),
    F("geometry", "calc", "volume of a cylinder", "radius height_geo", snake=("cylinder_volume",)),
    F("geometry", "calc", "volume of a cone", "radius height_geo", snake=("cone_volume",)),
    F("geometry", "calc", "distance between two points", "x1 y1 x2 y2", snake=("point_distance", "euclidean_distance")),
    F("geometry", "calc", "sum of interior angles of a polygon", "n_sides ?angle_unit", snake=("interior_angle_sum", "polygon_angle_sum")),
    F("geometry", "calc", "surface area of a cube", "side", snake=("cube_surface_area",)),
    F("geometry", "calc", "area of a trapezoid", "base1 base2 height_geo", snake=("trapezoid_area",)),
    F("geometry", "calc", "perimeter of a triangle", "side_a side_b side_c", snake=("triangle_perimeter",)),
    F("geometry", "calc", "area of a regular polygon", "n_sides side", snake=("regular_polygon_area", "polygon_area")),
    # finance
    F("finance", "calc", "compound interest", "principal annual_rate years ?compounds"),
    F("finance", "calc", "simple interest", "principal rate_pct years"),
    F("finance", "calc", "monthly loan payment", "loan_amount rate_pct loan_term", snake=("loan_payment", "monthly_payment")),
    F("finance", "calc", "return on investment", "gain cost", snake=("roi", "return_on_investment")),
    F("finance", "calc", "future value", "present_value annual_rate periods", snake=("future_value", "fv")),
    F("finance", "get", "stock price", "ticker ?exchange", snake=("stock_price", "share_price", "quote")),
    F("finance", "convert", "currency", "money from_currency to_currency",
      asks=("convert an amount of money between currencies", "do a currency conversion", "exchange some money"),
      doc=("Convert an amount from one currency to another at the current rate.", "Currency converter."),
      snake=("currency", "money")),
    F("finance", "calc", "sales tax", "price tax_rate", snake=("sales_tax", "tax_amount")),
    F("finance", "calc", "tip amount", "bill tip_pct ?split", snake=("tip", "tip_amount", "gratuity")),
    F("finance", "calc", "net present value", "cash_flows discount_rate", snake=("npv", "net_present_value")),
    F("finance", "calc", "straight-line depreciation", "asset_cost salvage useful_life", snake=("depreciation", "straight_line_depreciation")),
    F("finance", "calc", "break-even point", "fixed_costs unit_price unit_cost", snake=("break_even", "break_even_point")),
    F("finance", "calc", "inflation-adjusted value", "money inflation years", snake=("inflation_adjusted_value", "real_value")),
    F("finance", "get", "stock price history", "ticker history_days ?dividends", "list:decimals",
      snake=("stock_history", "price_history", "historical_prices")),
    F("finance", "get", "annual revenue of a company", "company year", snake=("company_revenue", "annual_revenue")),
    # physics
    F("physics", "calc", "kinetic energy", "mass velocity"),
    F("physics", "calc", "gravitational potential energy", "mass height_m ?gravity", snake=("potential_energy",)),
    F("physics", "calc", "net force", "mass acceleration", snake=("force", "net_force")),
    F("physics", "calc", "final velocity", "initial_velocity acceleration time_s"),
    F("physics", "calc", "momentum", "mass velocity", snake=("momentum", "linear_momentum")),
    F("physics", "calc", "electric current", "voltage resistance", snake=("current", "ohms_law_current")),
    F("physics", "calc", "power output", "work time_s", snake=("power_output", "mechanical_power")),
    F("physics", "calc", "wavelength", "frequency ?wave_speed"),
    F("physics", "calc", "density", "mass volume_l", snake=("density",)),
    F("physics", "calc", "pressure", "force area_m2", snake=("pressure",)),
    F("physics", "calc", "free fall time", "height_m ?gravity", snake=("fall_time", "free_fall_time")),
    F("physics", "calc", "projectile range", "initial_velocity angle ?gravity", snake=("projectile_range",)),
    F("physics", "calc", "electrostatic force", "charge1 charge2 distance_m", snake=("coulomb_force", "electrostatic_force")),
    F("physics", "calc", "spring potential energy", "spring_k displacement", snake=("spring_energy", "elastic_energy")),
    F("physics", "get", "speed of sound", "?medium temp_k", snake=("sound_speed", "speed_of_sound")),
    # chemistry
    F("chemistry", "calc", "molar mass", "formula", snake=("molar_mass", "molecular_weight")),
    F("chemistry", "calc", "number of moles", "mass_g molar_mass", snake=("moles", "mass_to_moles")),
    F("chemistry", "calc", "pH of a solution", "h_conc", snake=("ph", "ph_value")),
    F("chemistry", "calc", "ideal gas pressure", "moles temp_k volume_l", snake=("ideal_gas_pressure", "gas_pressure")),
    F("chemistry", "get", "element properties", "element ?element_prop", "text:element_facts",
      snake=("element_properties", "element_info", "periodic_table")),
    F("chemistry", "calc", "dilution volume", "conc1 vol1 vol2", snake=("dilution", "final_concentration")),
    F("chemistry", "calc", "remaining amount after radioactive decay", "amount_g half_life elapsed",
      snake=("radioactive_decay", "remaining_amount", "half_life_decay")),
    F("chemistry", "calc", "heat energy", "mass_g specific_heat delta_t", snake=("heat_energy", "heat_transfer")),
    F("chemistry", "calc", "molarity", "moles volume_sol", snake=("molarity", "molar_concentration")),
    F("chemistry", "get", "boiling point of a compound", "compound_name ?pressure_atm", snake=("boiling_point",)),
    # statistics
    F("statistics", "calc", "mean", "numbers", snake=("mean", "average", "arithmetic_mean")),
    F("statistics", "calc", "median", "numbers", snake=("median",)),
    F("statistics", "calc", "standard deviation", "measurements ?sample_sd", snake=("standard_deviation", "std_dev", "stdev")),
    F("statistics", "calc", "variance", "measurements", snake=("variance",)),
    F("statistics", "calc", "mode", "numbers", "integer", snake=("mode", "most_common_value")),
    F("statistics", "calc", "percentile", "numbers pct_rank", snake=("percentile",)),
    F("statistics", "calc", "correlation coefficient", "x_values y_values", snake=("correlation", "pearson_correlation")),
    F("statistics", "calc", "z-score", "score mean std_dev", snake=("z_score", "zscore", "standard_score")),
    F("statistics", "calc", "binomial probability", "trials successes prob", snake=("binomial_probability", "binomial_pmf")),
    F("statistics", "calc", "confidence interval", "mean std_dev sample_n ?conf_level", "list:decimals",
      snake=("confidence_interval",)),
    F("statistics", "calc", "t-test p-value", "group_a group_b ?alpha", snake=("t_test", "ttest", "two_sample_t_test")),
    F("statistics", "calc", "linear regression prediction", "x_values y_values x_new",
      snake=("linear_regression_prediction", "regression_prediction")),
    F("statistics", "calc", "range of a data set", "numbers", "integer", snake=("data_range", "value_range")),
    F("statistics", "calc", "dice roll probability", "target_sum ?n_dice ?dice_sides", snake=("dice_probability", "roll_probability")),
    # unit conversion
    F("units", "convert", "length", "quantity len_from len_to ?round_to",
      asks=("convert a length", "convert a distance between units", "change a length to another unit"),
      snake=("length", "length_units", "distance_units")),
    F("units", "convert", "temperature", "temp_value scale_from scale_to",
      asks=("convert a temperature", "convert a temperature between scales"), snake=("temperature", "temperature_scale")),
    F("units", "convert", "weight", "quantity mass_from mass_to ?round_to",
      asks=("convert a weight", "convert a mass between units"), snake=("weight", "mass_units", "weight_units")),
    F("units", "convert", "volume", "quantity vol_from vol_to",
      asks=("convert a volume", "convert a volume between units"), snake=("volume", "volume_units")),
    F("units", "convert", "speed", "quantity speed_from speed_to",
      asks=("convert a speed", "convert a speed between units"), snake=("speed", "speed_units", "velocity_units")),
    F("units", "convert", "area", "quantity area_from area_to",
      asks=("convert an area", "convert an area between units"), snake=("area", "area_units")),
    F("units", "convert", "time duration", "quantity time_from time_to",
      asks=("convert a time duration", "convert a duration between units"), snake=("duration", "time_units")),
    F("units", "convert", "data size", "quantity data_from data_to",
      asks=("convert a data size", "convert a file size between units"), snake=("data_size", "storage_units", "bytes")),
    F("units", "convert", "energy", "quantity energy_from energy_to",
      asks=("convert an amount of energy", "convert energy between units"), snake=("energy", "energy_units")),
    # geography
    F("geography", "get", "capital city of a country", "country", "text:cities", snake=("capital", "capital_city")),
    F("geography", "get", "population of a country", "country ?census_year", "integer", snake=("population", "country_population")),
    F("geography", "calc", "distance between two cities", "city_a city_b ?dist_unit", snake=("city_distance", "distance_between_cities")),
    F("geography", "get", "timezone of a city", "city", "text:timezones", snake=("city_timezone", "timezone")),
    F("geography", "get", "elevation of a city", "city", snake=("elevation", "altitude")),
    F("geography", "search", "largest cities in a country", "country ?limit", "list:cities",
      asks=("list the largest cities in a country", "find the biggest cities of a country"), snake=("largest_cities", "biggest_cities")),
    F("geography", "get", "neighboring countries", "country", "list:countries", snake=("neighbors", "neighboring_countries", "borders")),
    F("geography", "get", "coordinates of a city", "city", "list:decimals", snake=("coordinates", "geocode", "lat_long")),
    F("geography", "get", "length of a river", "river", snake=("river_length",)),
    F("geography", "get", "official languages of a country", "country", "list:languages", snake=("official_languages", "languages")),
    # weather
    F("weather", "get", "current weather", "city ?units", "text:conditions", snake=("current_weather", "weather_now", "weather")),
    F("weather", "get", "weather forecast", "city forecast_days ?hourly ?units", "text:conditions", snake=("forecast", "weather_forecast")),
    F("weather", "get", "air quality index", "city ?pollutant", "integer", snake=("air_quality", "aqi")),
    F("weather", "get", "historical temperature", "city day", snake=("historical_temperature", "past_temperature")),
    F("weather", "get", "UV index", "city day", "integer", snake=("uv_index", "uv")),
    F("weather", "get", "chance of rain", "city day", snake=("rain_probability", "precipitation_chance")),
    F("weather", "get", "sunrise and sunset times", "city day", "list:times", snake=("sun_times", "sunrise_sunset")),
    F("weather", "get", "wind speed", "city ?units", snake=("wind_speed", "wind")),
    # sports
    F("sports", "get", "league standings", "league season", "list:teams", snake=("standings", "league_table", "league_standings")),
    F("sports", "get", "player statistics", "player season ?stat_type", "text:stat_lines", snake=("player_stats", "player_statistics")),
    F("sports", "get", "match result", "home_team away_team day", "text:scores", snake=("match_result", "game_score", "fixture_result")),
    F("sports", "get", "team schedule", "team ?n_games", "list:dates", snake=("team_schedule", "fixtures", "upcoming_games")),
    F("sports", "get", "top scorers of a league", "league season ?limit", "list:people", snake=("top_scorers", "leading_scorers")),
    F("sports", "calc", "batting average", "hits at_bats", snake=("batting_average",)),
    F("sports", "get", "player ranking", "sport player", "integer", snake=("player_ranking", "world_ranking", "ranking")),
    F("sports", "get", "tournament winner", "tournament season", "text:people", snake=("tournament_winner", "champion")),
    F("sports", "calc", "goal difference", "goals_for goals_against", "integer", snake=("goal_difference",)),
    # music
    F("music", "search", "songs by an artist", "artist ?genre ?limit", "list:titles", snake=("songs", "songs_by_artist", "tracks")),
    F("music", "get", "song lyrics", "song artist", "text:lyrics", snake=("lyrics", "song_lyrics")),
    F("music", "get", "album details", "album artist", "text:album_facts", snake=("album", "album_details", "album_info")),
    F("music", "make", "playlist", "playlist_name songs ?public", "text:codes", snake=("playlist",)),
    F("music", "search", "concerts", "artist city", "list:dates", snake=("concerts", "concert_dates", "tour_dates")),
    F("music", "calc", "frequency of a musical note", "note ?tuning", snake=("note_frequency", "pitch_frequency")),
    F("music", "get", "notes of a chord", "root ?chord_type", "list:notes", snake=("chord_notes", "chord")),
    F("music", "calc", "duration of a musical passage", "beats bpm", snake=("passage_duration", "beats_to_seconds")),
    F("music", "search", "music teachers", "instrument city", "list:people", snake=("music_teachers", "teachers")),
    # cooking
    F("cooking", "search", "recipes", "dish ?diet ?max_minutes", "list:titles", snake=("recipes", "recipe")),
    F("cooking", "search", "recipes by ingredients", "ingredients ?limit", "list:titles",
      asks=("find recipes I can make with some ingredients", "search recipes that use certain ingredients"),
      snake=("recipes_by_ingredients", "recipe_by_ingredients")),
    F("cooking", "calc", "scaled recipe factor", "servings_from servings_to", snake=("scale_factor", "recipe_scale")),
    F("cooking", "get", "nutrition facts", "food ?serving_g", "text:nutrition", snake=("nutrition", "nutrition_facts", "nutrients")),
    F("cooking", "calc", "roasting time", "meat weight_kg ?doneness", snake=("roasting_time", "cooking_time")),
    F("cooking", "get", "ingredient substitute", "ingredient", "text:ingredients", snake=("substitute", "ingredient_substitute")),
    F("cooking", "get", "wine pairing", "dish", "text:wines", snake=("wine_pairing", "wine_match")),
    F("cooking", "convert", "cooking measurement", "quantity cook_from cook_to",
      asks=("convert a cooking measurement", "convert a kitchen measurement"), snake=("cooking_units", "kitchen_measure")),
    F("cooking", "calc", "calories in a meal", "ingredients ?servings_from", "integer", snake=("meal_calories", "recipe_calories")),
    # travel
    F("travel", "search", "flights", "origin_code dest_code travel_date ?passengers ?cabin", "list:flights",
      snake=("flights", "flight")),
    F("travel", "book", "hotel room", "city checkin nights ?rooms", "text:codes", snake=("hotel", "hotel_room")),
    F("travel", "search", "hotels", "city max_price ?min_rating", "list:titles", snake=("hotels", "hotel_rooms")),
    F("travel", "book", "rental car", "city checkin rental_days ?car_type", "text:codes", snake=("rental_car", "car_rental", "car")),
    F("travel", "get", "visa requirements", "citizenship destination_country", "text:visa", snake=("visa_requirements", "visa_rules")),
    F("travel", "calc", "estimated trip cost", "city trip_days travellers ?budget_level", snake=("trip_cost", "travel_budget")),
    F("travel", "search", "tourist attractions", "city ?attraction_type", "list:titles", snake=("attractions", "points_of_interest")),
    F("travel", "search", "train connections", "city_a city_b travel_date", "list:times", snake=("trains", "train_connections")),
    # health
    F("health", "calc", ("body mass index", "BMI"), "body_kg height_m2", snake=("bmi", "body_mass_index")),
    F("health", "calc", ("basal metabolic rate", "BMR"), "body_kg height_cm age sex", snake=("bmr", "basal_metabolic_rate")),
    F("health", "calc", "calories burned", "activity minutes body_kg", "integer", snake=("calories_burned", "burned_calories")),
    F("health", "calc", "daily water intake", "body_kg ?activity_level", snake=("water_intake", "hydration_needs")),
    F("health", "calc", "target heart rate", "age ?intensity", "integer", snake=("target_heart_rate", "heart_rate_zone")),
    F("health", "calc", "ideal body weight", "height_cm sex", snake=("ideal_weight", "ideal_body_weight")),
    F("health", "get", "medication dosage", "drug body_kg age", "text:dosages", snake=("dosage", "medication_dosage")),
    F("health", "check", "symptoms", "symptoms", "text:advice",
      asks=("check some symptoms", "get advice about my symptoms", "run a symptom check"),
      doc=("Checks a list of symptoms and suggests possible causes.", "Symptom checker."), full=("check_symptoms", "symptom_checker", "analyze_symptoms")),
    F("health", "calc", "wake-up time", "bedtime ?sleep_cycles", "text:times", snake=("wake_time", "wake_up_time")),
    F("health", "calc", "pregnancy due date", "last_period", "text:dates", snake=("due_date", "pregnancy_due_date")),
    F("health", "calc", "walking distance from steps", "steps ?stride_m", snake=("steps_to_distance", "step_distance")),
    # astronomy
    F("astronomy", "get", "planet facts", "planet ?planet_prop", "text:planet_facts", snake=("planet_facts", "planet_info", "planet")),
    F("astronomy", "calc", "distance between planets", "planet planet_b day", snake=("planet_distance", "interplanetary_distance")),
    F("astronomy", "get", "star information", "star", "text:star_facts", snake=("star_info", "star")),
    F("astronomy", "get", "moon phase", "day", "text:moon_phases", snake=("moon_phase", "lunar_phase")),
    F("astronomy", "calc", "orbital period", "axis_au", snake=("orbital_period", "kepler_period")),
    F("astronomy", "calc", "escape velocity", "earth_masses earth_radii", snake=("escape_velocity",)),
    F("astronomy", "calc", "light travel time", "dist_km", snake=("light_travel_time", "light_time")),
    F("astronomy", "get", "ISS pass times", "city ?pass_days", "list:times", snake=("iss_passes", "iss_pass_times")),
    F("astronomy", "get", "next eclipse", "city ?eclipse_type", "text:dates", snake=("next_eclipse", "eclipse")),
    F("astronomy", "calc", "distance in parsecs", "light_years", snake=("light_years_to_parsecs", "parsecs")),
    # biology
    F("biology", "get", "complementary DNA strand", "sequence ?reverse", "text:dna", snake=("dna_complement", "complement_strand")),
    F("biology", "calc", "GC content", "sequence", snake=("gc_content", "gc_ratio")),
    F("biology", "get", "protein function", "protein", "text:protein_facts", snake=("protein_function", "protein_info")),
    F("biology", "get", "species information", "animal", "text:species_facts", snake=("species_info", "species", "animal_facts")),
    F("biology", "calc", "population growth", "pop0 growth gens", "integer", snake=("population_growth", "exponential_growth")),
    F("biology", "calc", "cell count after division", "gens ?cells0", "integer", snake=("cell_division", "cell_count")),
    F("biology", "calc", "Hardy-Weinberg genotype frequencies", "allele_p", "list:decimals", snake=("hardy_weinberg", "genotype_frequencies")),
    F("biology", "calc", "offspring genotype probabilities", "genotype1 genotype2", "list:decimals",
      snake=("punnett_square", "offspring_genotypes")),
    F("biology", "search", "species by habitat", "habitat ?limit", "list:animals", snake=("species_by_habitat", "habitat_species")),
    # history
    F("history", "get", "date of a historical event", "event", "text:years", snake=("event_date", "historical_event_date")),
    F("history", "get", "biography of a historical figure", "figure", "text:bios", snake=("biography", "historical_figure")),
    F("history", "search", "historical events by year", "hist_year ?region", "list:events", snake=("events_in_year", "events_by_year")),
    F("history", "get", "ruler of a country in a given year", "country hist_year", "text:people", snake=("ruler", "head_of_state")),
    F("history", "search", "historical timeline", "country start_year end_year", "list:events", snake=("timeline", "history_timeline")),
    F("history", "get", "major battles of a war", "war", "list:battles", snake=("battles", "war_battles")),
    F("history", "search", "inventions of a decade", "decade", "list:inventions",
      asks=("list the inventions of a decade", "find inventions from a given decade"),
      doc=("Lists notable inventions of a decade , given by its first year (e.g. 1920 for the 1920s).",),
      snake=("inventions", "decade_inventions")),
    F("history", "calc", "radiocarbon age", "c14", "integer", snake=("carbon_dating", "radiocarbon_age")),
    # law
    F("law", "search", "court cases", "law_topic jurisdiction ?since_year", "list:cases", snake=("case_law", "court_cases")),
    F("law", "get", "case details", "case_no ?include_closed", "text:case_status", snake=("case_details", "case_info", "case_status")),
    F("law", "get", "statute of limitations", "jurisdiction claim", snake=("statute_of_limitations", "limitation_period")),
    F("law", "search", "lawyers", "city specialty", "list:people", snake=("lawyers", "attorneys")),
    F("law", "calc", "legal fees", "hours hourly_rate", snake=("legal_fees", "attorney_fees")),
    F("law", "get", "ruling of a court case", "case_title", "text:rulings", snake=("case_ruling", "verdict")),
    # real estate
    F("real_estate", "calc", "monthly mortgage payment", "home_price down_payment rate_pct loan_term",
      snake=("mortgage_payment", "mortgage")),
    F("real_estate", "get", "estimated property value", "street_address city ?bedrooms", snake=("property_value", "home_valuation")),
    F("real_estate", "search", "property listings", "city max_home_price ?min_beds ?property_type", "list:addresses",
      snake=("listings", "property_listings", "homes_for_sale")),
    F("real_estate", "calc", "rental yield", "annual_rent home_price", snake=("rental_yield", "gross_yield")),
    F("real_estate", "calc", "property tax", "assessed tax_rate", snake=("property_tax",)),
    F("real_estate", "calc", "price per square foot", "home_price sqft", snake=("price_per_sqft", "price_per_square_foot")),
    F("real_estate", "calc", "affordable home price", "income debts ?annual_rate", snake=("affordability", "max_home_price")),
    F("real_estate", "get", "neighborhood profile", "zip", "text:neighborhoods", snake=("neighborhood", "neighborhood_profile")),
    # date and time
    F("datetime", "calc", "number of days between two dates", "date_a date_b", "integer", snake=("days_between", "date_difference")),
    F("datetime", "calc", "date after adding days", "some_date days_delta", "text:dates", snake=("date_plus_days",), full=("add_days_to_date", "add_days")),
    F("datetime", "get", "day of the week", "some_date", "text:weekdays", snake=("weekday", "day_of_week")),
    F("datetime", "get", "current time in a timezone", "tz", "text:times", snake=("current_time", "time_in_zone", "world_clock")),
    F("datetime", "convert", "time between timezones", "clock_time tz_from tz_to",
      asks=("convert a time from one timezone to another", "translate a clock time between timezones"),
      snake=("timezone", "time_zone", "tz")),
    F("datetime", "calc", "age from a birth date", "birth_date ?ref_date", "integer", snake=("age", "age_from_birthdate")),
    F("datetime", "check", "leap year", "cal_year", "bool",
      asks=("check whether a year is a leap year", "find out if a year is a leap year"),
      doc=("Returns true if the year is a leap year.", "Check whether a year is a leap year."), snake=("leap_year",), full=("is_leap_year",)),
    F("datetime", "calc", "number of business days", "date_a date_b ?holiday_country", "integer", snake=("business_days", "working_days")),
    F("datetime", "get", "ISO week number", "some_date", "integer", snake=("week_number", "iso_week")),
    # text utilities
    F("text", "get", "reversed string", "input_text", "text:phrases",
      asks=("reverse a string", "reverse some text"), doc=("Reverse the characters of a string.",), full=("reverse_string", "reverse_text", "string_reverse")),
    F("text", "calc", "word count", "input_text", "integer", snake=("word_count",), full=("count_words",)),
    F("text", "check", "palindrome", "maybe_palindrome ?ignore_case", "bool",
      asks=("check whether a word is a palindrome", "find out if some text is a palindrome"),
      doc=("Returns true if the text reads the same backwards.", "Check whether a string is a palindrome."),
      snake=("palindrome",), full=("is_palindrome",)),
    F("text", "calc", "number of vowels", "input_text", "integer", snake=("vowel_count",), full=("count_vowels",)),
    F("text", "convert", "string case", "input_text case", "text:phrases",
      asks=("change the case of some text", "convert a string to another case"), snake=("case", "string_case")),
    F("text", "calc", "substring occurrences", "input_text substring ?ignore_case", "integer",
      snake=("substring_count", "occurrences"), full=("count_substring",)),
    F("text", "make", "text with a word replaced", "input_text old_word new_word", "text:phrases",
      asks=("replace a word in some text", "swap one word for another in a sentence"),
      doc=("Replace every occurrence of a word in a text.",), full=("replace_word", "replace_in_text", "substitute_word")),
    F("text", "make", "truncated string", "input_text max_len ?suffix", "text:phrases",
      asks=("truncate some text", "shorten a string to a maximum length"), full=("truncate_text", "truncate_string", "shorten_text")),
    F("text", "make", "Caesar cipher", "input_text shift", "text:phrases",
      asks=("encrypt some text with a Caesar cipher", "apply a Caesar shift to a string"), full=("caesar_cipher", "caesar_encrypt", "encrypt_caesar")),
    F("text", "calc", "edit distance", "text_a text_b", "integer", snake=("levenshtein_distance", "edit_distance")),
    F("text", "check", "anagram pair", "text_a text_b", "bool",
      asks=("check whether two words are anagrams", "find out if two strings are anagrams of each other"),
      doc=("Returns true if the two strings are anagrams.",), full=("is_anagram", "are_anagrams", "check_anagram")),
    F("text", "make", "URL slug", "input_text ?separator", "text:phrases",
      asks=("turn some text into a URL slug", "slugify a title"), full=("slugify", "make_slug", "to_slug")),
    # movies and tv
    F("movies", "search", "movies", "movie_genre ?release_year ?min_score", "list:titles", snake=("movies", "films")),
    F("movies", "get", "movie details", "movie", "text:movie_facts", snake=("movie_details", "movie_info", "film_details")),
    F("movies", "search", "showtimes", "movie city day", "list:times", snake=("showtimes", "screenings")),
    F("movies", "get", "filmography of an actor", "actor", "list:titles", snake=("filmography", "actor_movies")),
    F("movies", "search", "movie recommendations", "movie ?rec_count", "list:titles", snake=("recommendations", "similar_movies")),
    F("movies", "get", "box office earnings", "movie", snake=("box_office", "box_office_gross")),
    F("movies", "get", "TV episode summary", "series season_no episode_no", "text:summaries", snake=("episode", "episode_summary")),
    # shopping
    F("shopping", "search", "products", "product_query ?limit ?sort_by", "list:products", snake=("products", "store_products")),
    F("shopping", "calc", "discounted price", "price discount_pct", snake=("discount_price", "sale_price", "discounted_price")),
    F("shopping", "get", "order status", "order", "text:statuses", snake=("order_status", "order"), full=("track_order",)),
    F("shopping", "calc", "shipping cost", "parcel_kg destination_country ?express", snake=("shipping_cost", "shipping_rate")),
    F("shopping", "make", "cart entry", "sku ?cart_qty", "text:codes",
      asks=("add an item to my shopping cart", "put a product in my cart"),
      doc=("Add a product to the shopping cart.", "Adds an item to the cart by product id."), full=("add_to_cart", "cart_add", "add_cart_item")),
    F("shopping", "check", "coupon code", "coupon", "bool",
      asks=("check whether a coupon code is valid", "verify a promo code"), full=("validate_coupon", "check_coupon", "verify_promo_code")),
    # computing
    F("computing", "convert", "number base", "int_value numeral_base", "text:codes",
      asks=("convert a number to another base", "convert an integer to a different numeral system"),
      snake=("number_base", "base", "radix")),
    F("computing", "calc", "hash of a string", "input_text ?hash_algo", "text:hashes", snake=("hash", "string_hash", "digest")),
    F("computing", "make", "random password", "pw_len ?symbols", "text:codes", snake=("password", "random_password")),
    F("computing", "get", "IP geolocation", "ip", "text:cities", snake=("ip_location", "ip_geolocation"), full=("geolocate_ip", "ip_lookup")),
    F("computing", "calc", "download time", "file_gb speed_mbps", snake=("download_time", "transfer_time")),
    F("computing", "check", "email address format", "email_addr", "bool",
      asks=("check whether an email address is valid", "validate an email address"), full=("is_valid_email", "validate_email", "check_email_format")),
    F("computing", "make", "short URL", "long_url", "text:codes", asks=("shorten a URL", "make a short link"),
      full=("shorten_url", "create_short_link", "url_shortener")),
    F("computing", "make", "random numbers", "rand_min rand_max ?rand_count", "list:integers",
      asks=("generate random numbers in a range", "pick random integers"), snake=("random_numbers", "random_integers")),
    F("computing", "convert", "hex color", "color", "list:integers",
      asks=("convert a hex color to RGB", "turn a hex color code into RGB values"), full=("hex_to_rgb", "convert_hex_to_rgb", "hex_color_to_rgb")),
    # language
    F("language", "get", "translation", "sentence target_lang ?source_lang", "text:phrases",
      asks=("translate some text", "translate a phrase"), full=("translate_text", "translate", "get_translation")),
    F("language", "get", "definition of a word", "word", "text:definitions", snake=("definition", "word_definition"), full=("define_word",)),
    F("language", "search", "synonyms", "word ?max_words", "list:words", snake=("synonyms",)),
    F("language", "search", "antonyms", "word ?max_words", "list:words", snake=("antonyms", "opposites")),
    F("language", "search", "rhyming words", "word ?max_words", "list:words", snake=("rhymes", "rhyming_words")),
    F("language", "calc", "syllable count", "word", "integer", snake=("syllables", "syllable_count")),
    # energy and environment
    F("energy", "calc", "carbon footprint", "carbon_activity activity_amount", snake=("carbon_footprint", "co2_emissions")),
    F("energy", "calc", "solar panel output", "panel_watts sun_hours ?efficiency", snake=("solar_output", "solar_energy")),
    F("energy", "calc", "electricity cost", "kwh kwh_price", snake=("electricity_cost", "energy_bill")),
    F("energy", "calc", "fuel cost of a trip", "trip_km fuel_eff fuel_price", snake=("fuel_cost", "trip_fuel_cost")),
    F("energy", "calc", "carbon captured by trees", "trees tree_years", snake=("tree_carbon", "carbon_sequestration")),
]

DOMAIN_ALIASES: dict[str, tuple[str, ...]] = {
    "math": ("math", "mathematics"), "geometry": ("geometry", "shapes"), "finance": ("finance", "fin", "money"),
    "physics": ("physics", "mechanics"), "chemistry": ("chemistry", "chem"), "statistics": ("stats", "statistics"),
    "units": ("units", "unit_conversion", "converter"), "geography": ("geography", "geo"), "weather": ("weather", "meteo"),
    "sports": ("sports", "sport"), "music": ("music",), "cooking": ("cooking", "kitchen", "recipes"),
    "travel": ("travel", "trips"), "health": ("health", "fitness", "medical"), "astronomy": ("astronomy", "astro", "space"),
    "biology": ("biology", "bio", "genetics"), "history": ("history",), "law": ("law", "legal"),
    "real_estate": ("real_estate", "property", "housing"), "datetime": ("datetime", "calendar", "date_utils"),
    "text": ("text", "string_utils", "strings"), "movies": ("movies", "cinema", "entertainment"),
    "shopping": ("shopping", "shop", "ecommerce"), "computing": ("computing", "tech", "utils"),
    "language": ("language", "dictionary", "lang"), "energy": ("energy", "environment", "eco"),
}

# Domains kept out of training under ``holdout: domains`` (a mix of "get" and "calc" worlds).
HOLDOUT_DOMAINS = ("astronomy", "law", "cooking", "language")

PRE_AMBLES: dict[str, tuple[str, ...]] = {
    "math": ("I'm working on my homework.", "I'm checking a calculation."),
    "geometry": ("I'm designing a small garden.", "This is for a geometry exercise."),
    "finance": ("I'm reviewing my savings.", "I'm planning my budget."),
    "physics": ("I'm studying for a physics exam.", "This is for a lab report."),
    "chemistry": ("I'm preparing a chemistry lab.", "I'm revising chemistry."),
    "statistics": ("I'm analysing some survey data.", "I have some data from an experiment."),
    "units": ("I'm following instructions written in other units.", "I need this for a report."),
    "geography": ("I'm preparing a geography quiz.", "I'm curious about the world."),
    "weather": ("I'm planning to go outside.", "I'm deciding what to wear."),
    "sports": ("I'm a big sports fan.", "I'm settling a bet with a friend."),
    "music": ("I'm putting together some music.", "I'm learning about music."),
    "cooking": ("I'm cooking dinner tonight.", "I'm planning meals for the week."),
    "travel": ("I'm planning a trip.", "We're organising a holiday."),
    "health": ("I'm trying to get healthier.", "I'm tracking my fitness."),
    "astronomy": ("I love stargazing.", "I'm writing about space."),
    "biology": ("I'm studying biology.", "This is for a genetics class."),
    "history": ("I'm reading about history.", "I'm preparing a history presentation."),
    "law": ("I'm researching a legal question.", "I'm helping a friend with a legal issue."),
    "real_estate": ("I'm thinking about buying a home.", "I'm looking at properties."),
    "datetime": ("I'm organising my calendar.", "I'm planning an event."),
    "text": ("I'm writing a small script.", "I'm cleaning up some text."),
    "movies": ("We're planning a movie night.", "I'm a film buff."),
    "shopping": ("I'm doing some online shopping.", "I'm trying to save money on purchases."),
    "computing": ("I'm setting up a server.", "I'm working on a programming task."),
    "language": ("I'm learning a new language.", "I'm writing an essay."),
    "energy": ("I'm trying to reduce my energy use.", "I'm looking at my household costs."),
}
GENERIC_PREAMBLES = ("Hi!", "Hello.", "Quick question.", "Hi there.", "Hey.")

# Pools the synthetic tool results draw from (``text:NAME`` / ``list:NAME`` results).
RESULT_POOLS: dict[str, tuple[str, ...]] = {
    "cities": CITIES, "countries": COUNTRIES, "languages": LANGUAGES, "people": tuple(f"{a} {b}" for a, b in zip(_FIRST, _LAST)),
    "titles": tuple(f"{a} {b}" for a in _ADJ[:8] for b in _NOUN[:6]), "teams": TEAMS, "animals": ANIMALS, "events": EVENTS,
    "words": WORDS, "notes": NOTES, "timezones": TIMEZONES, "products": PRODUCTS, "ingredients": INGREDIENTS,
    "conditions": ("sunny, 22 degrees", "partly cloudy, 17 degrees", "light rain, 12 degrees", "overcast, 9 degrees",
                   "snow showers, -2 degrees", "clear skies, 28 degrees", "thunderstorms, 24 degrees"),
    "times": ("06:12", "07:45", "09:30", "12:05", "14:20", "17:55", "19:40", "21:15"),
    "dates": ("2025-01-14", "2025-03-02", "2025-05-27", "2025-07-09", "2025-09-18", "2025-11-30", "2026-02-11"),
    "years": ("1066", "1215", "1440", "1492", "1776", "1789", "1903", "1928", "1969", "1989"),
    "weekdays": ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"),
    "moon_phases": ("new moon", "waxing crescent", "first quarter", "waxing gibbous", "full moon", "waning gibbous",
                    "last quarter", "waning crescent"),
    "statuses": ("processing", "shipped", "out for delivery", "delivered", "awaiting payment"),
    "codes": ("CONF-48213", "X7K2-PQ9", "PL-20931", "BK-55120", "a9F!kq2Lm", "https://sho.rt/x8Kq", "1101011"),
    "hashes": ("5d41402abc4b2a76", "9f86d081884c7d65", "e3b0c44298fc1c14", "2c26b46b68ffc68f"),
    "flights": ("AB123 departing 08:15", "CX455 departing 11:40", "LM902 departing 15:05", "QR318 departing 19:50"),
    "scores": ("2-1", "0-0", "3-2", "1-4", "105-98", "24-17"),
    "stat_lines": ("24.3 points, 6.1 assists", "18 goals, 7 assists", "11.2 rebounds, 3.4 blocks", ".312 average, 28 home runs"),
    "lyrics": ("Verse one begins: 'Under the neon sky we run...'", "Chorus: 'Hold on, hold on, the night is young...'"),
    "album_facts": ("released 2019, 11 tracks, 44 minutes", "released 2008, 9 tracks, 38 minutes"),
    "element_facts": ("atomic number 26, atomic mass 55.85", "atomic number 8, atomic mass 16.00", "symbol Cu, electronegativity 1.90"),
    "planet_facts": ("mass 6.42e23 kg, 2 moons", "radius 58232 km, 146 moons", "surface gravity 3.7 m/s2"),
    "star_facts": ("spectral type A1V, 8.6 light years away", "red supergiant, about 550 light years away"),
    "nutrition": ("52 kcal, 0.3 g fat, 14 g carbohydrates", "165 kcal, 3.6 g fat, 31 g protein", "389 kcal, 6.9 g fat, 66 g carbohydrates"),
    "wines": ("Chianti", "Sauvignon Blanc", "Pinot Noir", "Riesling", "Malbec"),
    "visa": ("visa-free for up to 90 days", "e-visa required before travel", "visa on arrival for 30 days"),
    "dosages": ("400 mg every 6 hours, at most 1200 mg a day", "500 mg every 8 hours", "10 mg once a day"),
    "advice": ("likely a common cold; rest and drink fluids", "possible flu; see a doctor if the fever lasts"),
    "dna": ("TACGGATC", "GCTAGCTTAA", "ATTGCCAGT", "CGGATTACAG"),
    "protein_facts": ("regulates blood glucose", "carries oxygen in the blood", "gives skin its strength"),
    "species_facts": ("lives in savannas, up to 190 kg", "lives in cold oceans, eats krill", "lives in forests, mostly nocturnal"),
    "bios": ("born 1769, emperor of the French", "born 1867, two Nobel prizes", "born 1815, first computer program"),
    "battles": ("Battle of Crecy", "Battle of Gettysburg", "Battle of Waterloo", "Battle of Agincourt", "Battle of Antietam"),
    "inventions": ("radio", "television", "jet engine", "transistor", "laser", "microwave oven"),
    "cases": ("Smith v. Jones (2012)", "Garcia v. Lopez (2018)", "Kim v. Patel (2009)", "Novak v. Silva (2021)"),
    "case_status": ("open, next hearing 2025-09-14", "closed, settled in 2023", "on appeal"),
    "rulings": ("ruled for the plaintiff", "ruled for the defendant", "dismissed without prejudice"),
    "addresses": ("12 Maple Street", "480 Oak Avenue", "77 Cedar Lane", "9 Lake Drive"),
    "neighborhoods": ("quiet residential, good schools, median price 540000", "lively downtown, many restaurants"),
    "movie_facts": ("2014, directed by Ana Silva, 128 minutes", "1999, directed by Omar Haddad, 96 minutes"),
    "summaries": ("The crew finds a signal from the old harbor.", "A storm forces everyone into the lighthouse."),
    "phrases": ("dlrow olleh", "HELLO WORLD", "hello-world", "Quick Brown Fox", "khoor zruog", "hello..."),
    "definitions": ("lasting a very short time", "able to recover quickly", "showing great attention to detail"),
    "integers": ("1", "2", "3", "5", "8", "13", "21"),
    "decimals": ("0.25", "0.5", "1.75", "2.4", "3.14"),
}
