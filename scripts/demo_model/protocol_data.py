"""Synthetic conversations in Qwen3's chat protocol, generated from this module's own lists.

Four kinds of example, each a conversation, the tools it offers (or none), whether thinking is on, and the reply
to learn:

* ``tool``: tools in the system turn and a request that one of them serves; the reply is one ``<tool_call>``
  block per call (``{"name": ..., "arguments": {...}}``) with the tool's name and parameter names copied from
  the tools list (both drawn at random per example from synonym lists, so they cannot be memorised) and the
  argument values taken from the request (a city, a unit, a number of days...);
* ``tool_result``: the same after the call and its ``<tool_response>``: a one-sentence answer from the result;
* ``no_tool``: tools offered but a request none of them serves (a short question): answered directly;
* ``short``: short questions with short answers: small arithmetic (answered with the number, or as a JSON
  object when asked), comparisons, capitals, greetings, "repeat this".

With thinking on (Qwen3's default) the reply opens with ``<think>\\n`` a sentence or two ``\\n</think>\\n\\n``;
with thinking off the prompt already ends with the empty think block and the reply is the answer alone.
``held_out=True`` draws from the parts of the lists kept out of training (every fifth city, country, word...,
and other verbs for tool names), for the evaluation.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

CITIES = [
    ("Lyon", "France"), ("Porto", "Portugal"), ("Krakow", "Poland"), ("Osaka", "Japan"), ("Seville", "Spain"),
    ("Munich", "Germany"), ("Bergen", "Norway"), ("Cork", "Ireland"), ("Turin", "Italy"), ("Ghent", "Belgium"),
    ("Denver", "USA"), ("Perth", "Australia"), ("Quebec", "Canada"), ("Cusco", "Peru"), ("Mombasa", "Kenya"),
    ("Busan", "South Korea"), ("Pune", "India"), ("Izmir", "Turkey"), ("Tartu", "Estonia"), ("Graz", "Austria"),
    ("Leeds", "UK"), ("Malmo", "Sweden"), ("Aarhus", "Denmark"), ("Tampere", "Finland"), ("Brno", "Czechia"),
    ("Cebu", "Philippines"), ("Recife", "Brazil"), ("Rosario", "Argentina"), ("Oaxaca", "Mexico"),
    ("Hanoi", "Vietnam"), ("Chiang Mai", "Thailand"), ("Cairo", "Egypt"), ("Tunis", "Tunisia"),
    ("Accra", "Ghana"), ("Durban", "South Africa"), ("Auckland", "New Zealand"), ("Basel", "Switzerland"),
    ("Utrecht", "Netherlands"), ("Split", "Croatia"), ("Varna", "Bulgaria"), ("Cluj", "Romania"),
    ("Debrecen", "Hungary"), ("Kaunas", "Lithuania"), ("Riga", "Latvia"), ("Oslo", "Norway"),
    ("Madrid", "Spain"), ("Rome", "Italy"), ("Paris", "France"), ("Berlin", "Germany"), ("Vienna", "Austria"),
    ("Lisbon", "Portugal"), ("Athens", "Greece"), ("Dublin", "Ireland"), ("Prague", "Czechia"),
    ("Warsaw", "Poland"), ("Tokyo", "Japan"), ("Seoul", "South Korea"), ("Lima", "Peru"), ("Bogota", "Colombia"),
    ("Nairobi", "Kenya"), ("Chicago", "USA"), ("Toronto", "Canada"), ("Sydney", "Australia"),
    ("Boston", "USA"), ("Edinburgh", "UK"), ("Helsinki", "Finland"), ("Stockholm", "Sweden"),
    ("Copenhagen", "Denmark"), ("Zurich", "Switzerland"), ("Milan", "Italy"), ("Valencia", "Spain"),
    ("Marseille", "France"), ("Hamburg", "Germany"), ("Salzburg", "Austria"), ("Kyoto", "Japan"),
    ("Montreal", "Canada"), ("Seattle", "USA"), ("Dallas", "USA"), ("Manila", "Philippines"), ("Jakarta", "Indonesia"),
]
CAPITALS = [
    ("France", "Paris"), ("Spain", "Madrid"), ("Italy", "Rome"), ("Germany", "Berlin"), ("Japan", "Tokyo"),
    ("Portugal", "Lisbon"), ("Greece", "Athens"), ("Ireland", "Dublin"), ("Poland", "Warsaw"), ("Norway", "Oslo"),
    ("Sweden", "Stockholm"), ("Finland", "Helsinki"), ("Denmark", "Copenhagen"), ("Austria", "Vienna"),
    ("Peru", "Lima"), ("Kenya", "Nairobi"), ("Egypt", "Cairo"), ("Canada", "Ottawa"), ("Australia", "Canberra"),
    ("Chile", "Santiago"), ("Cuba", "Havana"), ("Hungary", "Budapest"), ("Belgium", "Brussels"),
    ("Netherlands", "Amsterdam"), ("Switzerland", "Bern"), ("Czechia", "Prague"), ("Romania", "Bucharest"),
    ("Turkey", "Ankara"), ("India", "New Delhi"), ("China", "Beijing"), ("Mexico", "Mexico City"),
    ("Brazil", "Brasilia"), ("Argentina", "Buenos Aires"), ("Ghana", "Accra"), ("Vietnam", "Hanoi"),
]
LANGUAGES = ["Spanish", "French", "German", "Italian", "Japanese", "Portuguese", "Dutch", "Polish", "Swedish",
             "Korean", "Greek", "Turkish", "Finnish", "Czech", "Hindi"]
PHRASES = ["good morning", "thank you very much", "where is the station", "I like green tea",
           "see you tomorrow", "the door is open", "my cat is asleep", "how much does it cost",
           "the train is late", "we are going home", "happy birthday", "the soup is hot", "I lost my keys",
           "it is raining again", "open the window please", "the shop closes at six", "I need a doctor",
           "this book is great", "let us meet at noon", "the river is cold"]
ECHO_WORDS = ["blue", "river", "quiet", "apple", "stone", "moon", "garden", "seven", "bright", "cloud", "paper",
              "silver", "window", "candle", "forest", "yellow", "tiger", "ocean", "winter", "music", "pencil",
              "coffee", "rocket", "smile", "bridge"]
EMOJIS = ["\U0001f600", "\U0001f680", "\U0001f436", "\U0001f30d", "\u2764\ufe0f", "\U0001f389", "\U0001f34e",
          "\u2600\ufe0f", "\U0001f4da", "\U0001f3b5"]
CURRENCIES = ["USD", "EUR", "GBP", "JPY", "CHF", "CAD", "AUD", "SEK", "NOK", "PLN", "INR", "BRL", "MXN", "KRW"]
CUISINES = ["Italian", "Thai", "Mexican", "Indian", "Japanese", "Greek", "vegan", "Korean", "French", "Turkish"]
TASKS = ["call the bank", "water the plants", "buy milk", "send the report", "book a dentist visit",
         "pick up the kids", "pay the rent", "walk the dog", "renew my passport", "back up the laptop"]
GREETINGS = [("Hi!", "Hello! How can I help you today?"),
             ("Hello there.", "Hello! What can I do for you?"),
             ("Hi, how are you?", "I am fine, thank you. How can I help?"),
             ("Good morning!", "Good morning! What do you need?"),
             ("Hey, are you there?", "Yes, I am here. How can I help?"),
             ("Thanks for your help!", "You are welcome!"),
             ("Thank you.", "Glad to help!"),
             ("Who are you?", "I am a small assistant model. I can answer short questions and call tools."),
             ("Goodbye!", "Goodbye, have a nice day!")]

# a tool's name: a verb and a noun of its domain, sometimes with a prefix or a suffix (so many names that the
# model must copy them from the tools list); the held-out verbs name only the evaluation's tools
TRAIN_VERBS = ["get", "fetch", "lookup", "query", "find", "check", "read", "request", "load", "show", "search",
               "list", "call", "look_up", "grab", "collect", "inspect", "resolve", "access", "view", "report",
               "poll", "scan", "ask"]
HELD_VERBS = ["retrieve", "obtain", "pull", "see"]
PREFIXES = ["api_", "my_", "tool_", "svc_", "ext_", "x_"]
SUFFIXES = ["_v2", "_now", "_info", "_tool", "_api", "_data"]


@dataclass(frozen=True)
class Param:
    """One parameter of a tool: its schema, and the value this request gives it (None: not given)."""

    name: str
    schema: dict
    value: object = None


@dataclass(frozen=True)
class Example:
    """One conversation to learn a reply to."""

    kind: str
    messages: list
    tools: list | None
    thinking: bool
    thought: str
    answer: str


def split(items: list, held_out: bool) -> list:
    """Every fifth item is held out of training."""
    return [x for i, x in enumerate(items) if (i % 5 == 4) == held_out]


class ToolDomain:
    """A kind of tool (weather, forecast, currency...): builds a random tool of the kind and a request for it."""

    nouns: tuple[str, ...] = ()
    descriptions: tuple[str, ...] = ()

    def __init__(self, rng: random.Random, held_out: bool):
        self.rng, self.held_out = rng, held_out

    def name(self) -> str:
        return decorate(self.rng, f"{self.rng.choice(HELD_VERBS if self.held_out else TRAIN_VERBS)}_"
                                  f"{self.rng.choice(self.nouns)}")

    def pick(self, items: list):
        return self.rng.choice(split(items, self.held_out))

    def tool(self, name: str, params: list[Param], required: list[str]) -> dict:
        """The OpenAI-style definition, sometimes with extra schema keys real tools carry."""
        props = {p.name: p.schema for p in params}
        parameters = {"type": "object", "properties": props, "required": required}
        if self.rng.random() < 0.3:
            parameters["additionalProperties"] = False
        return {"type": "function", "function": {"name": name, "description": self.rng.choice(self.descriptions),
                                                 "parameters": parameters}}

    def build(self) -> tuple[list[Param], list[str], str, str, str]:
        """(parameters with the request's values, the required ones, the request, a one-line JSON result, the
        answer from that result)."""
        raise NotImplementedError


def decorate(rng: random.Random, name: str) -> str:
    """``name``, sometimes with a prefix or a suffix."""
    if rng.random() < 0.3:
        name = rng.choice(PREFIXES) + name
    if rng.random() < 0.2:
        name += rng.choice(SUFFIXES)
    return name


def with_suffix(text: str, suffix: str) -> str:
    """``suffix`` before the sentence's final ``?`` or ``.`` (at the end if none)."""
    return text[:-1] + suffix + text[-1] if text[-1] in "?." else text + suffix


def _string(desc: str, **extra) -> dict:
    return {"type": "string", "description": desc, **extra}


def _optional_extra(rng: random.Random) -> list[Param]:
    """Optional parameters that requests never give (the call leaves them out)."""
    pool = [Param("language", _string("Language of the response", enum=["en", "de", "fr"], default="en")),
            Param("verbose", {"type": "boolean", "description": "Include more detail", "default": False}),
            Param("limit", {"type": "integer", "description": "Maximum number of results", "default": 5}),
            Param("options", {"type": "object", "description": "Extra settings",
                              "properties": {"detail": {"type": "boolean", "default": False},
                                             "format": {"type": "string", "enum": ["short", "long"]}}})]
    return rng.sample(pool, rng.randint(0, 2))


class Weather(ToolDomain):
    nouns = ("weather_report", "local_weather", "city_weather", "weather_now", "conditions", "temperature",
             "current_conditions", "weather_info")
    descriptions = ("Get the current weather for a city", "Current weather conditions in a location",
                    "Return the present temperature and sky in a place", "Look up the weather right now in a city")

    def build(self):
        r = self.rng
        city, country = self.pick(CITIES)
        unit = r.choice(["celsius", "fahrenheit", None])
        with_country = r.random() < 0.4
        city_key = r.choice(["city", "location", "place", "town", "city_name"])
        unit_key = r.choice(["unit", "units", "temperature_unit", "scale"])
        params = [Param(city_key, _string("The city, e.g. 'Oslo'"), city)]
        if r.random() < 0.7 or with_country:
            params.append(Param("country", _string("The country of the city"), country if with_country else None))
        params.append(Param(unit_key, _string("Temperature unit", enum=["celsius", "fahrenheit"]), unit))
        params += _optional_extra(r)
        where = f"{city}, {country}" if with_country else city
        ask = r.choice(["What is the weather in {w}?", "How warm is it in {w} right now?",
                        "Can you check the weather in {w}?", "Tell me the current weather in {w}.",
                        "what's the weather like in {w}", "Is it cold in {w} today?"]).format(w=where)
        if unit:
            ask = with_suffix(ask, f" in {unit}")
        degrees = r.randint(-5, 35)
        sky = r.choice(["sunny", "cloudy", "rainy", "windy", "foggy"])
        result = {"temperature": degrees, "unit": unit or "celsius", "sky": sky}
        answer = f"It is {degrees} degrees {unit or 'celsius'} and {sky} in {city}."
        return params, [city_key], ask, json.dumps(result), answer


class Forecast(ToolDomain):
    nouns = ("weather_forecast", "daily_forecast", "forecast_days", "outlook", "forecast_report")
    descriptions = ("Get the weather forecast for the coming days in a city",
                    "Forecast of the weather for a number of days", "Predict the weather in a place for some days")

    def build(self):
        r = self.rng
        city, _ = self.pick(CITIES)
        days = r.randint(1, 10)
        unit = r.choice(["celsius", "fahrenheit", None])
        city_key = r.choice(["city", "location", "place"])
        days_key = r.choice(["days", "num_days", "n_days", "day_count"])
        params = [Param(city_key, _string("The city to forecast"), city),
                  Param(days_key, {"type": "integer", "description": "Number of days (1-10)"}, days),
                  Param(r.choice(["unit", "units"]), _string("Temperature unit", enum=["celsius", "fahrenheit"]),
                        unit)]
        ask = r.choice(["What will the weather be in {c} for the next {d} days?",
                        "Give me the {d}-day forecast for {c}.", "Forecast for {c} over the next {d} days, please.",
                        "How will the weather be in {c} in the coming {d} days?"]).format(c=city, d=days)
        if unit:
            ask = with_suffix(ask, f" in {unit}")
        highs = [r.randint(0, 30) for _ in range(min(days, 3))]
        return params, [city_key, days_key], ask, json.dumps({"highs": highs}), \
            f"The highs in {city} will be around {highs[0]} degrees."


class Currency(ToolDomain):
    nouns = ("exchange_rate", "currency_conversion", "converted_amount", "fx_rate")
    descriptions = ("Convert an amount of money from one currency to another",
                    "Exchange an amount between two currencies at today's rate")

    def build(self):
        r = self.rng
        src, dst = r.sample(CURRENCIES, 2)
        amount = r.choice([5, 10, 20, 50, 75, 100, 120, 250, 300, 500, 1000])
        keys = r.choice([("amount", "from_currency", "to_currency"), ("value", "source", "target"),
                         ("amount", "base", "quote"), ("sum", "from", "to")])
        params = [Param(keys[0], {"type": "number", "description": "How much money"}, amount),
                  Param(keys[1], _string("Currency code to convert from, e.g. 'EUR'"), src),
                  Param(keys[2], _string("Currency code to convert to"), dst)]
        ask = r.choice(["Convert {a} {s} to {d}.", "How much is {a} {s} in {d}?",
                        "What do I get for {a} {s} in {d}?"]).format(a=amount, s=src, d=dst)
        value = round(amount * r.uniform(0.5, 2.0), 2)
        return params, list(keys), ask, json.dumps({"result": value, "currency": dst}), \
            f"{amount} {src} is about {value} {dst}."


class Translate(ToolDomain):
    nouns = ("translation", "translated_text", "translator")
    descriptions = ("Translate a text into another language", "Machine translation of a short text")

    def build(self):
        r = self.rng
        phrase = self.pick(PHRASES)
        lang = self.pick(LANGUAGES)
        text_key = r.choice(["text", "sentence", "source_text"])
        lang_key = r.choice(["target_language", "language", "to_lang", "target"])
        params = [Param(text_key, _string("The text to translate"), phrase),
                  Param(lang_key, _string("The language to translate into"), lang)]
        ask = r.choice(["Translate '{p}' into {l}.", "How do you say '{p}' in {l}?",
                        "Please translate \"{p}\" to {l}."]).format(p=phrase, l=lang)
        return params, [text_key, lang_key], ask, json.dumps({"translation": "..."}), \
            f"Here is '{phrase}' in {lang}."


class Restaurants(ToolDomain):
    nouns = ("restaurants", "places_to_eat", "restaurant_list", "dining_options")
    descriptions = ("Search restaurants by cuisine in a city", "Find places to eat in a city")

    def build(self):
        r = self.rng
        city, _ = self.pick(CITIES)
        cuisine = self.pick(CUISINES)
        city_key = r.choice(["city", "location", "area"])
        food_key = r.choice(["cuisine", "food_type", "kind"])
        params = [Param(city_key, _string("Where to search"), city),
                  Param(food_key, _string("Type of food"), cuisine)] + _optional_extra(r)
        ask = r.choice(["Find me a {f} restaurant in {c}.", "Where can I eat {f} food in {c}?",
                        "Any good {f} places in {c}?"]).format(f=cuisine, c=city)
        name = r.choice(["Casa Verde", "The Lantern", "Blue Door", "Little Garden", "Corner Table"])
        return params, [city_key, food_key], ask, json.dumps({"results": [name]}), \
            f"You could try {name} in {city}."


class Reminder(ToolDomain):
    nouns = ("reminder", "new_reminder", "alarm_note")
    descriptions = ("Create a reminder for a task at a given time", "Set a reminder")

    def name(self) -> str:
        verbs = ["create", "set", "add", "make", "new", "put"] if not self.held_out else ["schedule", "register"]
        return decorate(self.rng, f"{self.rng.choice(verbs)}_{self.rng.choice(self.nouns)}")

    def build(self):
        r = self.rng
        task = self.pick(TASKS)
        time = f"{r.randint(6, 21)}:{r.choice(['00', '15', '30', '45'])}"
        task_key = r.choice(["task", "text", "message", "what"])
        time_key = r.choice(["time", "at", "when"])
        params = [Param(task_key, _string("What to be reminded of"), task),
                  Param(time_key, _string("Time of day, HH:MM"), time)]
        ask = r.choice(["Remind me to {t} at {h}.", "Set a reminder to {t} at {h}.",
                        "At {h}, remind me to {t}."]).format(t=task, h=time)
        return params, [task_key, time_key], ask, json.dumps({"ok": True}), f"Done: I will remind you at {time}."


class Stock(ToolDomain):
    nouns = ("stock_price", "share_price", "quote", "ticker_price")
    descriptions = ("Get the latest price of a stock by its ticker symbol", "Current share price of a company")

    def build(self):
        r = self.rng
        symbol = "".join(r.choice("ABCDEFGHIJKLMNOPRSTUVWXYZ") for _ in range(r.randint(2, 4)))
        key = r.choice(["symbol", "ticker", "stock"])
        params = [Param(key, _string("Ticker symbol, e.g. 'ACME'"), symbol)] + _optional_extra(r)
        ask = r.choice(["What is {s} trading at?", "Price of {s} stock?", "How much is one share of {s}?",
                        "Check the stock price of {s}."]).format(s=symbol)
        price = round(r.uniform(5, 400), 2)
        return params, [key], ask, json.dumps({"price": price}), f"{symbol} is at {price}."


class NoArgs(ToolDomain):
    nouns = ("random_joke", "server_status", "todays_date", "random_fact", "uptime")
    descriptions = ("Takes no parameters.",)
    asks = {"random_joke": "Tell me a joke.", "server_status": "Is the server up?",
            "todays_date": "What is the date today?", "random_fact": "Give me a random fact.",
            "uptime": "How long has the machine been running?"}

    def build(self):
        noun = self.rng.choice(self.nouns)
        self._noun = noun
        return [], [], self.asks[noun], json.dumps({"value": "ok"}), "Here you go: ok."

    def name(self) -> str:
        return decorate(self.rng, f"{self.rng.choice(HELD_VERBS if self.held_out else TRAIN_VERBS)}_{self._noun}")


DOMAINS = (Weather, Forecast, Currency, Translate, Restaurants, Reminder, Stock, NoArgs)


def arithmetic(rng: random.Random) -> tuple[str, int, str]:
    """(expression, value, a one-line working) of small arithmetic."""
    op = rng.choice("++-*")
    if op == "*":
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        return f"{a} * {b}", a * b, f"{a} times {b} is {a * b}."
    a, b = rng.randint(0, 12), rng.randint(0, 12)
    if op == "-":
        a, b = max(a, b), min(a, b)
        return f"{a} - {b}", a - b, f"{a} minus {b} is {a - b}."
    return f"{a} + {b}", a + b, f"{a} plus {b} is {a + b}."


class Generator:
    """Draws examples of every kind from a seeded ``random.Random``."""

    def __init__(self, seed: int, held_out: bool = False):
        self.rng = random.Random(seed)
        self.held_out = held_out

    def pick(self, items):
        return self.rng.choice(split(items, self.held_out))

    # ---- short questions -------------------------------------------------------------------------------------
    def short(self) -> tuple[str, str, str]:
        """(question, thought, answer)."""
        r = self.rng
        kind = r.choices(["math", "math_json", "compare", "capital", "greet", "echo"], [5, 2, 2, 2, 1, 2])[0]
        if kind in ("math", "math_json"):
            expr, value, working = arithmetic(r)
            spaced = expr if r.random() < 0.5 else expr.replace(" ", "")
            q = r.choice(["What is {e}?", "what is {e}?", "Compute {e}.", "{e} = ?", "How much is {e}?",
                          "Calculate {e}.", "What's {e}? Be brief."]).format(e=spaced)
            if kind == "math_json":
                key = r.choice(["answer", "value", "result", "total", "sum", "n"])
                q += r.choice([f" Answer as a JSON object with the key \"{key}\".",
                               f" Reply in JSON, like {{\"{key}\": ...}}.",
                               f" Respond with JSON: {{\"{key}\": <number>}}"])
                return q, f"{working} The user wants JSON with the key {key}.", json.dumps({key: value})
            if r.random() < 0.3:
                q += r.choice([" Only the number, please.", " Just give the result.", " Answer briefly."])
            return q, working, str(value)
        if kind == "compare":
            a, b = r.sample(range(0, 100), 2)
            big = r.random() < 0.5
            q = r.choice(["Which is {w}, {a} or {b}?", "Which number is {w}: {a} or {b}?",
                          "{a} or {b}: which is {w}?"]).format(w="larger" if big else "smaller", a=a, b=b)
            ans = max(a, b) if big else min(a, b)
            return q, f"Comparing {a} and {b}, the {'larger' if big else 'smaller'} one is {ans}.", str(ans)
        if kind == "capital":
            country, capital = self.pick(CAPITALS)
            q = r.choice(["What is the capital of {c}?", "Capital of {c}?", "Which city is the capital of {c}?"])
            return q.format(c=country), f"The capital of {country} is {capital}.", f"{capital}."
        if kind == "greet":
            q, a = r.choice(GREETINGS)
            return q, "The user greets me. I reply politely and briefly.", a
        words = " ".join(r.choice(split(ECHO_WORDS, self.held_out)) for _ in range(r.randint(1, 5)))
        if r.random() < 0.4:
            words += " " + r.choice(EMOJIS)
        q = r.choice(["Repeat after me: {w}", "Say exactly this: {w}", "Please repeat: {w}", "Echo: {w}"])
        return q.format(w=words), "The user wants the words repeated exactly.", words

    def short_example(self) -> Example:
        q, thought, answer = self.short()
        messages = self.with_context([{"role": "user", "content": q}])
        return Example("short", messages, None, self.rng.random() < 0.6, thought, answer)

    def with_context(self, messages: list) -> list:
        """Sometimes a system turn and an earlier exchange before the request."""
        r = self.rng
        if r.random() < 0.25:
            q, a = r.choice(GREETINGS)
            messages = [{"role": "user", "content": q}, {"role": "assistant", "content": a}] + messages
        if r.random() < 0.3:
            messages = [{"role": "system", "content": r.choice(["You are a helpful assistant.",
                                                                "You are a concise assistant.",
                                                                "Answer briefly and use tools when useful."])}] + messages
        return messages

    # ---- tools -----------------------------------------------------------------------------------------------
    def tool_examples(self) -> list[Example]:
        """One request served by a tool, as the call and (sometimes) the answer after the result; or a request
        that no offered tool serves."""
        r = self.rng
        classes = r.sample(DOMAINS, r.choices([1, 2, 3], [4, 4, 2])[0])
        built = []
        for cls in classes:
            domain = cls(r, self.held_out)
            params, required, ask, result, answer = domain.build()
            name = domain.name()
            given = [p.name for p in params]
            tool = domain.tool(name, params, [k for k in required if k in given])
            built.append((tool, name, params, ask, result, answer))
        tools = [b[0] for b in built]
        thinking = r.random() < 0.6
        if r.random() < 0.15:  # a request none of them serves
            q, thought, answer = self.short()
            messages = self.with_context([{"role": "user", "content": q}])
            return [Example("no_tool", messages, tools, thinking, thought + " No tool is needed.", answer)]
        _, name, params, ask, result, answer = r.choice(built)
        args = {p.name: p.value for p in params if p.value is not None}
        call = "<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call>"
        thought = f"The tool {name} can answer this, so I call it" + (" with no arguments." if not args else ".")
        messages = self.with_context([{"role": "user", "content": ask}])
        out = [Example("tool", messages, tools, thinking, thought, call)]
        if r.random() < 0.3:
            done = messages + [{"role": "assistant", "content": "",
                                "tool_calls": [{"type": "function", "id": "call_0",
                                                "function": {"name": name, "arguments": json.dumps(args)}}]},
                               {"role": "tool", "tool_call_id": "call_0", "content": result}]
            out.append(Example("tool_result", done, tools, thinking, "The tool answered; I report its result.",
                               answer))
        return out


def reply_text(example: Example) -> str:
    """What the model learns to write after the generation prompt (with thinking on, the think block first)."""
    body = example.answer + "<|im_end|>\n"
    return f"<think>\n{example.thought}\n</think>\n\n{body}" if example.thinking else body


def render(tokenizer, example: Example) -> tuple[str, str]:
    """(prompt, reply): the prompt rendered by the chat template, thinking on or off."""
    kwargs = {"tools": example.tools} if example.tools else {}
    prompt = tokenizer.apply_chat_template(example.messages, tokenize=False, add_generation_prompt=True,
                                           enable_thinking=example.thinking, **kwargs)
    return prompt, reply_text(example)
