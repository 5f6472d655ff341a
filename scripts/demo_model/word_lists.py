"""The word lists the synthetic protocol conversations are drawn from (``protocol_data``, ``tool_domains``),
and their split: every fifth item is held out of training, for the evaluation."""

from __future__ import annotations

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


def split(items: list, held_out: bool) -> list:
    """Every fifth item is held out of training."""
    return [x for i, x in enumerate(items) if (i % 5 == 4) == held_out]
