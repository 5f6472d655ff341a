"""The kinds of tool of the synthetic conversations: each builds a random tool definition of its kind (its name
and parameter names drawn from synonyms) and a request for it, with the call's arguments and a result."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

from demo_model.word_lists import (
    CITIES,
    CUISINES,
    CURRENCIES,
    HELD_VERBS,
    LANGUAGES,
    PHRASES,
    PREFIXES,
    SUFFIXES,
    TASKS,
    TRAIN_VERBS,
    split,
)


@dataclass(frozen=True)
class Param:
    """One parameter of a tool: its schema, and the value this request gives it (None: not given)."""

    name: str
    schema: dict
    value: object = None


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
