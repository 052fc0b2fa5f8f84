"""Secret-bearing lines in every form a Python job prints, each with the secret it holds, for
the redaction-gate tests (issue 34): none of these secrets may reach any sink. And lines that
only look alike (metric counts, prose, tracebacks) that every sink must keep as they are."""
from __future__ import annotations

#: (line, secret): the secret is a unique string, so finding it anywhere is a leak.
SECRET_LINES: tuple[tuple[str, str], ...] = (
    ("config: {'wandb_api_key': 'wk0a1b2c3d4e5f', 'lr': 0.1}", "wk0a1b2c3d4e5f"),
    ('{"hf_token": "hfx9y8z7w6v5", "step": 5}', "hfx9y8z7w6v5"),
    ("headers: Authorization: Bearer bearertok.abc123", "bearertok.abc123"),
    ("password: 918273645", "918273645"),
    ("Namespace(lr=0.1, hf_token='nsTok_5566aa', seed=1)", "nsTok_5566aa"),
    ("run --api-key apik3y-0099 --max-tokens 512", "apik3y-0099"),
    ("argv: --db-password=dbpw-7788 --lr=3e-4", "dbpw-7788"),
    ("DATABASE_URL=postgres://trainer:urlpw-4455@db:5432/x", "urlpw-4455"),
    ("curl -H 'Authorization: Basic dXNlcjpiYXNpY3B3'", "dXNlcjpiYXNpY3B3"),
    ("hub login with hf_AbCdEfGhIjKlMnOpQrStUvWx ok", "hf_AbCdEfGhIjKlMnOpQrStUvWx"),
    ("client = OpenAI(sk-proj-Zz9Yy8Xx7Ww6Vv5Uu4Tt3S)", "sk-proj-Zz9Yy8Xx7Ww6Vv5Uu4Tt3S"),
    ("cloning with ghp_0123456789abcdefghijABCDEFGHIJ", "ghp_0123456789abcdefghijABCDEFGHIJ"),
    ("s3 client AKIAIOSFODNN7EXAMPL1 us-east-1", "AKIAIOSFODNN7EXAMPL1"),
    ("jwt=eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJqb2IifQ.c2lnbmF0dXJlMTIz", "eyJzdWIiOiJqb2IifQ"),
    ('export AWS_SECRET_ACCESS_KEY="awsSecret/Key+123"', "awsSecret/Key+123"),
    ("secret_key : 'skv-value-99'", "skv-value-99"),
    ("X-Api-Key: xapikey-3141", "xapikey-3141"),
    ("slack xoxb-1234-5678-abcdefghij", "xoxb-1234-5678-abcdefghij"),
    ("{'password': 'two words pw'}", "two words pw"),
    ("client_secret=cs00aa11bb, retry=3", "cs00aa11bb"),
    ("my password hunter2isit", "hunter2isit"),
    ("opts = {'api_key': 4815162342}", "4815162342"),
    # The third review's defects: a bytes literal, a PEM key, an escaped quote, "=>"/"->"/":=".
    ("{'secret': b'zqC6x'}", "zqC6x"),
    ("private_key: -----BEGIN PRIVATE KEY-----MIIEvzqC3x", "MIIEvzqC3x"),
    ("loaded -----BEGIN EC PRIVATE KEY----- MHcCzqP3x+/= -----END EC PRIVATE KEY----- ok", "MHcCzqP3x"),
    ("key = '-----BEGIN OPENSSH PRIVATE KEY-----\\nb3BlbnzqP4x\\n-----END OPENSSH PRIVATE KEY-----\\n'",
     "b3BlbnzqP4x"),
    ('{"password": "a\\"zqC8x"}', "zqC8x"),
    ('api_key => "zqB2x"', "zqB2x"),
    ("db_secret -> zqB3xv", "zqB3xv"),
    ('auth_token := "zqB4x"', "zqB4x"),
    # Its risks: names outside TOKEN/KEY/SECRET/PASSWORD, cookies, requests' auth, URL-encoded pairs.
    ("pwd: zqR1xpw", "zqR1xpw"),
    ("MYSQL_PWD=zqR2xsql", "zqR2xsql"),
    ("passphrase: zqR3xphrase", "zqR3xphrase"),
    ("Cookie: theme=dark; sid=zqR4xcookie", "zqR4xcookie"),
    ("Set-Cookie: sessionid=zqR5xset; Path=/; HttpOnly", "zqR5xset"),
    ("resumed session_id=zqR6xsid step=5", "zqR6xsid"),
    ("requests.get(url, auth=('trainer', 'zqR7xauth'))", "zqR7xauth"),
    ("HTTPBasicAuth('trainer', 'zqS3xbasic')", "zqS3xbasic"),
    ("GET /cb?next=%2Fx%3Fpassword%3DzqR8xenc%26y%3D1", "zqR8xenc"),
    ("redirect: /login?token%3DzqR9xenc", "zqR9xenc"),
    ("credentials: zqS1xcred", "zqS1xcred"),
    ("passwd=zqS2xpasswd", "zqS2xpasswd"),
    ("KeyError: password=zqS4xinner", "zqS4xinner"),
    # The fourth review's: a subscript with a secret-named key, a token as a URL's user, the word
    # "pass" as a key, mysql's glued -p, an XML element named for a secret.
    ('os.environ["HF_TOKEN"] = "zqU1xenv"', "zqU1xenv"),
    ("os.environ['WANDB_API_KEY']='zqU2xwb'", "zqU2xwb"),
    ("secrets['db_password'] = 'zqU3xdb'", "zqU3xdb"),
    ("git clone https://zqU4x0123456789abcdef@github.com/o/r.git", "zqU4x0123456789abcdef"),
    ("pass=zqU5xpw", "zqU5xpw"),
    ("openssl enc -aes256 -pass pass:zqU8xssl", "zqU8xssl"),
    ("mysql -h db -uroot -pzqU6xmy train", "zqU6xmy"),
    ("mysqldump -u root -p'zqU9xdump' train > dump.sql", "zqU9xdump"),
    ("<password>zqU7xxml</password>", "zqU7xxml"),
    ('<config><apiKey kind="wandb">zqV1xxml</apiKey></config>', "zqV1xxml"),
    # The fifth review's: a call's quoted name then its value, mariadb/mysql/openssl command lines,
    # .NET/Android/Java XML forms, CDATA, HTML-escaped tags, a spaced subscript, triple quotes.
    ("os.putenv('HF_TOKEN', 'zqW1xputenv')", "zqW1xputenv"),
    ('os.environ.setdefault("HF_TOKEN", "zqW2xsetdef")', "zqW2xsetdef"),
    ('os.environ.get("HF_TOKEN", "zqW3xget")', "zqW3xget"),
    ("token = os.environ.get('HF_TOKEN', default='zqW4xdefault')", "zqW4xdefault"),
    ("setattr(cfg, 'api_key', 'zqW5xsetattr')", "zqW5xsetattr"),
    ('os.putenv( "WANDB_API_KEY" ,b"zqW6xspaced" )', "zqW6xspaced"),
    ("mariadb -h db -uroot -pzqW7xmaria train", "zqW7xmaria"),
    ("MariaDB-dump -u root -p'zqW8xmdump' train", "zqW8xmdump"),
    ("mysql -pzqW9xglued", "zqW9xglued"),
    ("mysql -u root --password=zqX1xmyeq train", "zqX1xmyeq"),
    ('mysql -u root --password="zqX2xmyq" train', "zqX2xmyq"),
    ("openssl enc -aes256 --pass zqX3xssl -in a", "zqX3xssl"),
    ("openssl rsa -passin pass:zqX4xpin -in k.pem", "zqX4xpin"),
    ("openssl pkcs12 -passout 'pass:zqX5xpout' -out k.p12", "zqX5xpout"),
    ("openssl enc -pass 'zqX6xsslq'", "zqX6xsslq"),
    ('<add key="Password" value="zqX7xnet"/>', "zqX7xnet"),
    ("<add key='ApiKey' value='zqX8xnetq' />", "zqX8xnetq"),
    ('<add key="Password" xdt:Transform="Replace" value="zqX9xnetr"/>', "zqX9xnetr"),
    ('<add value="zqXAxnets" key="Password"/>', "zqXAxnets"),
    ("<add value='zqXBxnett' xdt:Locator='Match(key)' name='api_key' />", "zqXBxnett"),
    ('<param name="token" value="zqX9xparam"/>', "zqX9xparam"),
    ("<password><![CDATA[zqY1xcdata]]></password>", "zqY1xcdata"),
    ("<Password><![CDATA[a]b zqY2xcdata]]></Password>", "zqY2xcdata"),
    ("&lt;password&gt;zqY3xhtml&lt;/password&gt;", "zqY3xhtml"),
    ("&LT;apiKey&GT;zqY4xhtml&LT;/apiKey&GT;", "zqY4xhtml"),
    ("&lt;string name=&quot;password&quot;&gt;zqY5xhtml&lt;/string&gt;", "zqY5xhtml"),
    ("secrets ['db_password'] = 'zqY6xsub'", "zqY6xsub"),
    ('secrets [ "db_password" ] = "zqY7xsub"', "zqY7xsub"),
    ("password = '''zqY8xtriple'''", "zqY8xtriple"),
    ('PASSWORD = """zqY9xtriple"""', "zqY9xtriple"),
    ("db_password='''two words zqZ1xtriple'''", "zqZ1xtriple"),
    ('<string name="password">zqZ2xandroid</string>', "zqZ2xandroid"),
    ("<string name='api_key'>zqZ3xandroid</string>", "zqZ3xandroid"),
    ('<entry key="password">zqZ4xjava</entry>', "zqZ4xjava"),
    ("the token password=zqZ5xafter", "zqZ5xafter"),
)

#: Lines no sink may change: numbers under names that count things, prose, a traceback's last line.
KEPT_LINES: tuple[str, ...] = (
    # a path whose name ends in a secret word is no flag: the words after it stay
    "cannot start: etcd refused user tsup with the password in /run/wrong-password (authentication failed)",
    "step=100 loss: 2.31 tokens: 12345678 tokens_per_sec=4500 max_tokens 512 lr=3e-4",
    "{'num_tokens': 2048, 'keys': 3, 'loss': 1.5}",
    "tokenizer loaded from gpt2; the token budget is spent",
    "KeyError: 'missing'",
    "checkpoint refused: missing top-level keys: model, optimizer (known keys: step)",
    "etcd: reading key_file=/etc/tls/client.pem and password_file /etc/etcd/pw",
    "epoch 3: 45%|####    | 450/1000 [00:10<00:12]",
    "basic setup done, see https://example.com/docs",
    # The shell's working directories are paths (a "pwd" that holds no path is a password).
    "cwd: pwd=/home/trainer PWD=/work/run OLDPWD=~/old",
    "num_key_value_heads=8 num_attention_heads=32 tokens_per_sec: 4500",
    "author: Jane Doe; AUTH_TYPE=basic cookies_enabled=True cookie_jar=/tmp/c.txt",
    "wandb: api_key=None (set WANDB_API_KEY), auth=none",
    "session 3 of 5, sessions=5",
    "ca: -----BEGIN CERTIFICATE-----MIIBszCCAVmg",
    # A URL's user that is a name, "pass" as a word, -p glued elsewhere, a harmless subscript or element.
    "git clone git@github.com:o/r.git; ssh://git@github.com/o/r https://jane.doe@host/x",
    "all tests pass: 3 of 3, pass 2 of 3, pass: ok, first pass=done, --pass-through bypass=on compass: north",
    "mysql -u root -p train; ssh -p2222 node1; pip install -e .",
    'os.environ["LR"] = "0.1"; os.environ["CUDA_VISIBLE_DEVICES"] = "0,1"; cfg["keys"] = 3',
    "<run><loss>2.31</loss><tokens>512</tokens><title>resumed</title></run>",
    # A quoted phrase before a comma, elements and attributes named for no secret, CDATA of a metric.
    'print("the key", value); log("tokens", 512)',
    '<string name="app_name">Trainer</string><item name="tokens">512</item>',
    "<loss><![CDATA[2.31]]></loss> &lt;loss&gt;2.31&lt;/loss&gt; &lt;tokens&gt;512&lt;/tokens&gt;",
    "step 5 loss 2.31 token count 1024 tokens/s 4500 max_tokens=512 /tmp/keys/password.txt",
    "mariadb -u root -p train; openssl enc -pass env:PASSVAR -in a",
    "docstring = '''Train the model.''' all tests pass 3 of 3",
)


def secrets() -> list[str]:
    return [s for _line, s in SECRET_LINES]


def leaks(text: str) -> list[str]:
    """The corpus secrets found in ``text`` (empty: none leaked)."""
    return [s for s in secrets() if s in text]
