"""Word lists and phrase patterns for :mod:`context_core.lifecycle.corrections` (data only, no
logic).

Everything is lower case (the detector matches on a lower-cased copy of the message).
"""

from __future__ import annotations


def _words(text: str) -> list[str]:
    return text.split()


CJK = "\u3400-\u4dbf\u4e00-\u9fff"

# Words that are never a new value: negations, affirmations, fillers, articles, pronouns,
# copulas, the verbs and prepositions of the cue phrases, politeness. "No, the unit" or
# "No, thanks" name no value.
NON_VALUES = frozenset(
    _words(
        """
    no not nope nah never none nothing neither nor n't don't dont doesn't didn't isn't
    wasn't aren't weren't can't cannot won't wouldn't shouldn't wrong incorrect mistake
    yes yeah yep yup ok okay right correct sure fine good great cool alright
    indeed exactly agreed maybe perhaps probably possibly
    actually instead rather please pls just well um uh oh hmm so then also really wait
    sorry again oops anyway basically honestly like still only even now here there
    the a an this that these those it it's its they them their he she we us you me my
    mine your our i i'm i'd i've one ones which what who something anything everything
    that's this's there's here's what's they're we're you're he's she's
    is are was were be been being am do does did has have had will would shall should
    must can could may might need needs want wants wanted use using used take pick go
    make set change switch update correct meant mean said say says told tell means
    to of for in on at by with and or but as from than into onto about per via vs
    thanks thank thx ty welcome cheers bye hi hello
    value field new old current
    """
    )
)

# Chinese words that are never a value on their own, and that split a run of Chinese
# characters into words ("单位应该是华氏度" -> 单位 / 华氏度).
CJK_NON_VALUES = _words(
    "我的意思是 我指的是 我说的是 我是说 应该是 应该为 应当是 应为 改成 改为 换成 换为 改用 改到 "
    "而是 不是 不对 错了 是错的 有误 不要 不用 就是 其实 实际上 没有 对的 是的 好的 谢谢 "
    "这个 那个 应该 不 没 对 是 好 嗯 用 要 它 就 也 还 吧 了 啊 呀 呢 哦 嘛 的"
)

# Sets of interchangeable values: a new value of the same kind as the field's current one
# ("fahrenheit" for a field holding "celsius") is evidence that the message is about it.
FAMILIES: tuple[frozenset[str], ...] = tuple(
    frozenset(_words(line))
    for line in (
        "celsius fahrenheit kelvin centigrade °c °f 摄氏度 华氏度 开尔文 摄氏 华氏",
        "pdf docx doc xlsx xls csv tsv json jsonl xml html htm md markdown txt pptx ppt png "
        "jpg jpeg svg gif yaml yml odt rtf epub parquet zip",
        "en zh de fr es ja ko it ru pt english chinese german french spanish japanese korean "
        "italian russian portuguese 中文 英文 英语 汉语 德语 法语 日语 韩语 西班牙语",
        "monday tuesday wednesday thursday friday saturday sunday mon tue wed thu fri sat sun "
        "周一 周二 周三 周四 周五 周六 周日 星期一 星期二 星期三 星期四 星期五 星期六 星期日",
        "january february march april june july august september october november december "
        "jan feb mar apr jun jul aug sep sept oct nov dec",
        "eur usd gbp cny rmb jpy chf euro euros dollar dollars yuan 欧元 美元 人民币 日元",
        "mm cm m km inch inches ft feet foot mile miles meter meters metre metres "
        "米 公里 厘米 毫米",
        "g kg mg lb lbs pound pounds oz ton tons 克 千克 公斤 吨",
        "bar psi pa kpa mpa atm mbar",
        "asc desc ascending descending 升序 降序",
        "low medium high critical urgent 低 中 高 紧急",
        "metric imperial 公制 英制",
        "daily weekly monthly yearly hourly 每天 每周 每月 每年",
    )
)

# Parts of field names that are units, not names ("pressure_bar" is named "pressure").
UNIT_WORDS = frozenset(
    _words(
        "km m cm mm kg g mg lb eur usd gbp cny rmb jpy bar psi pa kpa pct percent s ms sec min "
        "h hr hour day week month year page item line word mb gb kb c f k eu us"
    )
)
# Parts of field names too generic to name the field alone.
GENERIC_NAME_PARTS = frozenset(
    _words("max min num number of the target limit total n id value current new old is")
)
# Chinese names of common field-name words ("单位" names the ``unit`` field).
CJK_FIELD_NAMES: dict[str, tuple[str, ...]] = {
    "unit": ("单位",),
    "page": ("页数",),
    "format": ("格式",),
    "device": ("设备",),
    "goal": ("目标",),
    "limit": ("上限", "限制"),
    "budget": ("预算",),
    "distance": ("距离",),
    "pressure": ("压力",),
    "temperature": ("温度",),
    "language": ("语言",),
    "date": ("日期",),
    "deadline": ("截止日期", "截止时间"),
    "threshold": ("阈值",),
    "city": ("城市",),
    "country": ("国家",),
    "currency": ("货币", "币种"),
    "price": ("价格",),
    "speed": ("速度",),
    "weight": ("重量",),
    "color": ("颜色",),
    "model": ("型号",),
    "location": ("位置", "地点"),
    "title": ("标题",),
    "topic": ("主题",),
    "mode": ("模式",),
    "version": ("版本",),
    "priority": ("优先级",),
}

CN_DIGITS = dict(
    zip("零一二两三四五六七八九十", (0, 1, 2, 2, 3, 4, 5, 6, 7, 8, 9, 10), strict=True)
)
CN_UNITS = {
    "页": "page",
    "天": "day",
    "日": "day",
    "小时": "hour",
    "分钟": "minute",
    "秒": "second",
    "周": "week",
    "个月": "month",
    "月": "month",
    "年": "year",
    "次": "time",
    "元": "yuan",
    "块": "yuan",
    "条": "item",
    "个": "",
    "台": "device",
    "行": "line",
    "字": "word",
}
UNIT_ALIASES = {"%": "percent", "pct": "percent", "hrs": "hour", "hr": "hour", "h": "hour"}

# Phrases that look negative but correct nothing; blanked before the cues are read.
NOT_A_CUE = (
    r"(?=[nwdio没不别])(?:\b(?:not\s+(?:sure|certain|bad|yet|only|just|merely|at\s+all"
    r"|a\s+problem|really\s+sure|too\s+bad|so\s+bad)"
    r"|no\s+(?:problem|worries|need|doubt|rush|idea|offen[cs]e|big\s+deal)|nothing|nobody"
    r"|(?:don'?t|do\s+not|never)\s+(?:forget|worry|mind|know)|why\s+not|if\s+not|or\s+not"
    r"|no\s+matter|not\s+to\s+mention)\b"
    r"|没(?:问题|关系)|不(?:客气|用谢|谢|确定|太确定|是很确定|知道|要忘了|要忘记|错|用担心|一定)"
    r"|别(?:忘了|忘记|担心))"
)
QUESTION_START = (
    r"^\s*(?:is|are|was|were|should|shouldn'?t|can|could|would|will|do|does|did|what|which"
    r"|why|how|when|where|who|isn'?t|aren'?t|didn'?t|doesn'?t)\b|^\s*(?:是不是|是否|难道)"
)
QUESTION_END = r"(?:\?|吗|呢|么|嘛)\s*[.!。]*\s*$"
HEDGES = (
    r"\b(?:maybe|perhaps|probably|possibly|might|i\s+think|i\s+guess|not\s+sure"
    r"|not\s+certain|i\s+wonder|(?:don'?t|do\s+not)\s+know)\b"
    r"|可能|也许|大概|或许|好像|不(?:确定|知道)"
)
NEGATION = (
    r"(?=[nwid不错别有])(?:\b(?:not|no|nope|nah|wrong|incorrect|isn'?t|wasn'?t|don'?t"
    r"|doesn'?t|never)\b|不(?:是|对|要)|错(?:了|的)|别用|有误)"
)

# --- cue patterns (regex sources, matched on the lower-cased message) ---------------------

SPAN = 160  # longest value read, in characters
_W = r"(?![a-z0-9_'])"  # end of an English cue word
# A value runs to the end of its clause: ".,;!?" followed by a space or the end, or any
# CJK punctuation. A "." or "," inside a token (2.5, 1,500, v1.2) stays part of the value.
_C = rf"(?:[^.,;!?。，；！？、\n]|[.,](?=[^\s{CJK}]))"
_V = rf"{_C}{{1,{SPAN}}}"
_OLD = rf"(?=\S){_C}{{1,80}}?"  # lazy: up to the connector; never only spaces
_FIELD = r"[^\s.,;!?]+(?:\s+[^\s.,;!?]+){0,3}?"
_CONNECT = (
    r"(?:but(?:\s+rather)?|rather|instead|it'?s|it\s+is|it\s+should\s+be|should\s+be|use"
    r"|make\s+it|go\s+with|i\s+(?:want|need|meant?|said)|we\s+(?:want|need))"
)

# (cue, weight, tier, regex matched at the cue word, what the text before the cue word is:
# "new" value, "old" value, "current": the old value and it must be the contract's, "hint"
# naming the field, or "alone": it must hold no value).
# Weight: "replace" names both sides, "correct" has a correction verb, "weak" a bare
# negation. Tier decides between claims on one field: 2 names the field or both sides.
CUE_PATTERNS: tuple[tuple[str, str, int, str, str], ...] = (
    (
        "not X but Y",
        "replace",
        2,
        rf"not{_W}\s*(?P<old>{_OLD})\s*[,;]?\s*{_CONNECT}{_W}\s*"
        rf"(?:(?:it'?s|it\s+is|use|rather|instead){_W}\s*)?(?P<new>{_V})",
        "",
    ),
    (
        "not X, Y",
        "replace",
        2,
        rf"not{_W}\s*(?P<old>{_OLD})\s*(?:[,;:]|[.!](?=\s))\s*(?P<new>{_V})",
        "alone",
    ),
    ("X -> Y", "replace", 2, rf"(?:->|=>|\u2192)\s*(?P<new>{_V})", "current"),
    ("Y, not X", "replace", 2, rf"not{_W}\s*(?P<old>{_V})", "new"),
    ("Y instead of X", "replace", 2, rf"(?:instead\s+of|rather\s+than){_W}\s*(?P<old>{_V})", "new"),
    (
        "X is wrong, Y",
        "replace",
        2,
        rf"(?:is|was|are)\s+(?:wrong|incorrect|not\s+right|a\s+mistake){_W}[\s,;:.]*"
        rf"(?:(?:(?:it|that|this)\s+)?(?:should\s+be|must\s+be|is|it'?s|use){_W}\s*)?"
        rf"(?P<new>{_V})",
        "old",
    ),
    (
        "don't use X, use Y",
        "replace",
        2,
        rf"(?:don'?t|do\s+not)\s+(?:use|take|pick|want){_W}\s*(?P<old>{_OLD})\s*[,;]?\s*"
        rf"(?:but\s+)?(?:use|take|pick|want){_W}\s*(?P<new>{_V})",
        "",
    ),
    (
        "<field> should be Y",
        "correct",
        1,
        rf"(?:should|must|needs\s+to|has\s+to|ought\s+to)\s+(?:really\s+)?be{_W}\s*(?P<new>{_V})",
        "hint",
    ),
    (
        "set <field> to Y",
        "correct",
        1,
        rf"(?:set|change|switch|update|correct|make){_W}\s*(?:(?P<field>{_FIELD})\s+)?"
        rf"(?:to|into){_W}\s*(?P<new>{_V})",
        "",
    ),
    (
        "I meant Y",
        "correct",
        1,
        rf"(?:i\s+meant?|i\s+said|what\s+i\s+meant?\s+(?:was|is)){_W}\s*(?P<new>{_V})",
        "",
    ),
    ("no, Y", "weak", 0, rf"(?:no|nope|nah|wrong|incorrect){_W}\s*[,.!:;-]+\s*(?P<new>{_V})", ""),
    (
        "actually, <field> is Y",
        "weak",
        0,
        rf"actually{_W}\s*,?\s*(?:(?:the\s+)?(?P<field>{_FIELD})\s+(?:is|are|=|should\s+be)"
        rf"{_W}\s*)?(?P<new>{_V})",
        "",
    ),
    (
        "不是X，是Y",
        "replace",
        2,
        rf"(?:不是|不用|不要)\s*(?P<old>(?=\S)[^，,。；！？]{{1,40}}?)\s*[，,]?\s*"
        rf"(?:而是|是|要|用|改用|应该是)\s*(?P<new>{_V})",
        "",
    ),
    (
        "X不对，是Y",
        "replace",
        2,
        rf"(?:不对|错了|是错的|有误)\s*[，,]?\s*(?:应该是|应为|是|改成|改为|用)\s*(?P<new>{_V})",
        "old",
    ),
    ("应该是Y", "correct", 1, rf"(?:应该是|应该为|应为|应当是)\s*(?P<new>{_V})", "hint"),
    ("改成Y", "correct", 1, rf"(?:改成|改为|换成|换为|改用|改到)\s*(?P<new>{_V})", "hint"),
    ("我是说Y", "correct", 1, rf"(?:我是说|我的意思是|我指的是|我说的是)\s*(?P<new>{_V})", ""),
    ("不对，Y", "weak", 0, rf"(?:不对|不是的|错了)\s*[，,]?\s*(?:用|是|要)?\s*(?P<new>{_V})", ""),
)
# Where a cue pattern may start (one pass over the message).
ANCHOR = (
    r"(?=[nwiodrsmcuah])(?<![a-z0-9_'])(?=(?:not|no|nope|nah|wrong|incorrect|instead\s+of"
    r"|rather\s+than|(?:is|was|are)\s+(?:wrong|incorrect|not|a\s+mistake)|don'?t|do\s+not"
    r"|should|must|needs\s+to|has\s+to|ought\s+to|set|change|switch|update|correct|make"
    rf"|i\s+meant?|i\s+said|what\s+i\s+meant?|actually){_W})"
    r"|(?=->|=>|\u2192)"
    r"|(?=不(?:是|用|要|对)|错了|是错的|有误|应(?:该是|该为|为|当是)|改(?:成|为|用|到)|换(?:成|为)"
    r"|我(?:是说|的意思是|指的是|说的是))"
)
# After a field named following a negation: "unit: Y", "unit is Y", "unit, it's Y", "unit Y".
NAMED = (
    r"\s*(?:(?:is|are|was|=|:|->|should\s+be|must\s+be|needs\s+to\s+be|has\s+to\s+be)"
    rf"{_W}\s*|[,;:]\s*(?:(?:it|that)\s+(?:is|should\s+be){_W}|it'?s|use|make\s+it){_W}\s*"
    rf"|(?:是|为|应该是|应为|改成|改为|换成|用)\s*|\s+)(?P<new>{_V})"
)
TRAILING_AND = r"(?:\s*(?:,|&|\band\b|以及|和|及|并且))+\s*$"
# Where a value read forward stops: "fahrenheit not celsius" -> "fahrenheit", "don't use
# fahrenheit" -> nothing. A predicate on it ("5 is not enough", "fahrenheit or kelvin")
# means it is not asserted at all.
CUT = (
    r"(?P<pred>\b(?:is|was|are|were)\s+(?:not|wrong|incorrect|too|no\s+longer)\b"
    r"|\b(?:isn'?t|wasn'?t|aren'?t|or)\b|还是|或者)"
    r"|\b(?:not|don'?t|do\s+not|never|instead\s+of|rather\s+than|but)(?![a-z0-9_'])"
    r"|而不是|不是|不对|错了|不要|不用|别用"
)
FILLER = (
    r"^(?:(?:it'?s|it\s+is|the|a|an|use|using|to|please|just|be|is|that|this|we\s+need"
    r"|i\s+want|make\s+it)\s+)+|^(?:用|是|要|就是)"
)
