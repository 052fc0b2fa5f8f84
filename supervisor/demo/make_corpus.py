"""Regenerate ``corpus.txt``, the text the demo GPT learns from.

The corpus is committed; this script only documents how it was made and lets anyone rebuild it
byte for byte (``python -m supervisor.demo.make_corpus``). It is a handful of public-domain poems
followed by prose from a small seeded grammar: varied enough that a tiny character-level model
has something to learn for a few hundred steps, regular enough that its loss falls visibly in a
one-minute CPU run. No download, no licence question.
"""

from __future__ import annotations

import random
from pathlib import Path

POEMS = """\
Sonnet 18, by William Shakespeare

Shall I compare thee to a summer's day?
Thou art more lovely and more temperate:
Rough winds do shake the darling buds of May,
And summer's lease hath all too short a date;
Sometime too hot the eye of heaven shines,
And often is his gold complexion dimm'd;
And every fair from fair sometime declines,
By chance or nature's changing course untrimm'd;
But thy eternal summer shall not fade,
Nor lose possession of that fair thou ow'st;
Nor shall Death brag thou wander'st in his shade,
When in eternal lines to time thou grow'st:
So long as men can breathe or eyes can see,
So long lives this, and this gives life to thee.

Ozymandias, by Percy Bysshe Shelley

I met a traveller from an antique land,
Who said: Two vast and trunkless legs of stone
Stand in the desert. Near them, on the sand,
Half sunk a shattered visage lies, whose frown,
And wrinkled lip, and sneer of cold command,
Tell that its sculptor well those passions read
Which yet survive, stamped on these lifeless things,
The hand that mocked them, and the heart that fed;
And on the pedestal, these words appear:
My name is Ozymandias, King of Kings;
Look on my Works, ye Mighty, and despair!
Nothing beside remains. Round the decay
Of that colossal Wreck, boundless and bare
The lone and level sands stretch far away.

The Tyger, by William Blake

Tyger Tyger, burning bright,
In the forests of the night;
What immortal hand or eye,
Could frame thy fearful symmetry?

In what distant deeps or skies,
Burnt the fire of thine eyes?
On what wings dare he aspire?
What the hand, dare seize the fire?

And what shoulder, and what art,
Could twist the sinews of thy heart?
And when thy heart began to beat,
What dread hand? and what dread feet?

What the hammer? what the chain,
In what furnace was thy brain?
What the anvil? what dread grasp,
Dare its deadly terrors clasp!

When the stars threw down their spears
And water'd heaven with their tears:
Did he smile his work to see?
Did he who made the Lamb make thee?

Tyger Tyger burning bright,
In the forests of the night:
What immortal hand or eye,
Dare frame thy fearful symmetry?

I Wandered Lonely as a Cloud, by William Wordsworth

I wandered lonely as a cloud
That floats on high o'er vales and hills,
When all at once I saw a crowd,
A host, of golden daffodils;
Beside the lake, beneath the trees,
Fluttering and dancing in the breeze.

Continuous as the stars that shine
And twinkle on the milky way,
They stretched in never-ending line
Along the margin of a bay:
Ten thousand saw I at a glance,
Tossing their heads in sprightly dance.

The waves beside them danced; but they
Out-did the sparkling waves in glee:
A poet could not but be gay,
In such a jocund company:
I gazed, and gazed, but little thought
What wealth the show to me had brought:

For oft, when on my couch I lie
In vacant or in pensive mood,
They flash upon that inward eye
Which is the bliss of solitude;
And then my heart with pleasure fills,
And dances with the daffodils.

Because I could not stop for Death, by Emily Dickinson

Because I could not stop for Death,
He kindly stopped for me;
The carriage held but just ourselves
And Immortality.

We slowly drove, he knew no haste,
And I had put away
My labor, and my leisure too,
For his civility.

We passed the school, where children strove
At recess, in the ring;
We passed the fields of gazing grain,
We passed the setting sun.

"""

# A small grammar: sentences about a village, the weather, work and travel. Word lists are short
# on purpose so the character model sees each word many times.
SUBJECTS = [
    "the miller", "the old sailor", "a young shepherd", "the smith", "my grandmother",
    "the schoolmaster", "a tired traveller", "the baker's daughter", "the ferryman",
    "the keeper of the light", "a wandering fiddler", "the parson", "the weaver",
]
VERBS_T = [
    "mended", "carried", "found", "watched", "sold", "painted", "counted", "remembered",
    "gathered", "followed", "lost", "praised", "opened", "closed", "sharpened",
]
OBJECTS = [
    "the old boat", "a basket of apples", "the broken gate", "the evening bread",
    "a letter from the city", "the lantern", "the heavy nets", "a bundle of wool",
    "the silver key", "the church bell", "a map of the coast", "the winter wood",
]
PLACES = [
    "by the river", "on the hill", "near the harbour", "in the market square",
    "under the elm tree", "at the edge of the forest", "beside the mill", "along the coast road",
    "behind the inn", "in the quiet garden",
]
TIMES = [
    "in the morning", "before the rain came", "when the tide turned", "at dusk",
    "all through the winter", "on the first day of spring", "after the harvest", "at midnight",
    "while the bells rang", "long ago",
]
WEATHER = [
    "The wind was cold and the sky was grey.", "The sun rose slowly over the fields.",
    "Rain fell softly on the roofs.", "A thick fog lay upon the water.",
    "The snow covered every path.", "The air was warm and full of bees.",
    "Clouds gathered over the sea.", "The stars were bright and very far away.",
]
FEELINGS = ["glad", "weary", "afraid", "hopeful", "silent", "proud", "sorry", "content"]
SAYINGS = [
    "We shall see what the morning brings", "Every road leads home at last",
    "A steady hand makes a straight furrow", "Do not trust a calm sea",
    "The river does not wait for anyone", "Bread and fire, and we are rich",
]


def _sentence(rng: random.Random) -> str:
    kind = rng.randrange(6)
    s, v, o = rng.choice(SUBJECTS), rng.choice(VERBS_T), rng.choice(OBJECTS)
    p, t = rng.choice(PLACES), rng.choice(TIMES)
    if kind == 0:
        text = f"{s} {v} {o} {p} {t}."
    elif kind == 1:
        text = f"{t.capitalize()}, {s} {v} {o}."
    elif kind == 2:
        text = rng.choice(WEATHER)
    elif kind == 3:
        text = f"{s} was {rng.choice(FEELINGS)}, for {rng.choice(SUBJECTS)} had {v} {o}."
    elif kind == 4:
        text = f'"{rng.choice(SAYINGS)}," said {s}.'
    else:
        text = f"{s} and {rng.choice(SUBJECTS)} walked {p} and {v} {o}."
    return text[0].upper() + text[1:]


def _prose(rng: random.Random, target_chars: int) -> str:
    paragraphs: list[str] = []
    size = 0
    chapter = 1
    while size < target_chars:
        if len(paragraphs) % 12 == 0:
            heading = f"Chapter {chapter}\n"
            paragraphs.append(heading)
            size += len(heading)
            chapter += 1
        para = " ".join(_sentence(rng) for _ in range(rng.randint(3, 7))) + "\n"
        paragraphs.append(para)
        size += len(para)
    return "\n".join(paragraphs)


def build_corpus(seed: int = 1234, target_chars: int = 90_000) -> str:
    """The corpus text: the poems, then seeded prose up to about ``target_chars`` characters."""
    rng = random.Random(seed)
    return POEMS + _prose(rng, target_chars - len(POEMS))


def main() -> None:
    path = Path(__file__).with_name("corpus.txt")
    path.write_text(build_corpus(), encoding="utf-8")
    print(f"wrote {path} ({path.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
