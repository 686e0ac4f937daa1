"""Seed schema and rows of the source database (`user_db`), as in the customer's source article.

Column names are part of the contract with the CDC job: keep them exactly as they are.
The local stack (lakehouse/local/mariadb.py) and the RDS seeding Lambda (bundled next to its handler
by infra/bundling.py) both seed from this module, so it must stay plain constants with no imports.
"""

PRODUCTS_DDL = """
CREATE TABLE IF NOT EXISTS products (
  productId VARCHAR(10) PRIMARY KEY,
  name VARCHAR(255) NOT NULL,
  description VARCHAR(512),
  product_price DECIMAL(10,4),
  update_time TIMESTAMP DEFAULT CURRENT_TIMESTAMP ON UPDATE CURRENT_TIMESTAMP
)
"""

USER_MEMBER_DDL = """
CREATE TABLE IF NOT EXISTS user_member (
  userid VARCHAR(10) PRIMARY KEY,
  name VARCHAR(255) NOT NULL,
  show_params VARCHAR(256),
  memberLevel INT,
  update_time TIMESTAMP DEFAULT CURRENT_TIMESTAMP ON UPDATE CURRENT_TIMESTAMP
)
"""

PRODUCT_ROWS = (
    ("1", "test01", "Small 2-wheel scooter", 11.11),
    ("2", "test02", "12V car battery", 11.11),
    ("3", "test03", "12-pack of drill bits with sizes ranging from #40 to #3", 11.11),
    ("4", "test04", "12oz carpenter's hammer", 11.11),
    ("5", "test05", "14oz carpenter's hammer", 11.11),
    ("6", "test06", "16oz carpenter's hammer", 11.11),
    ("7", "test07", "box of assorted rocks", 11.11),
    ("8", "test08", "water resistent black wind breaker", 11.11),
    ("9", "test09", "24 inch spare tire", 11.11),
)

USER_MEMBER_ROWS = (
    ("513248", "test01", "label01", 1),
    ("10952", "test02", "label02", 2),
    ("555655", "test03", "label03", 3),
    ("795098", "test04", "label04", 4),
    ("603670", "test05", "label05", 5),
)

# INSERT IGNORE: re-seeding never overwrites rows the demo (or a CDC test) has since changed.
INSERT_PRODUCT = (
    "INSERT IGNORE INTO products (productId, name, description, product_price) VALUES (%s, %s, %s, %s)"
)
INSERT_USER_MEMBER = (
    "INSERT IGNORE INTO user_member (userid, name, show_params, memberLevel) VALUES (%s, %s, %s, %s)"
)

# ---- the CDC user: the same privileges on RDS and on the local stack ----------------------------------

# CDC's snapshot writes one row here as an ordering barrier (jobs/cdc/snapshot.py): the only write
# it makes on the source. A schema of its own, which CDC never syncs. Same name as
# jobs.cdc.source_db.SNAPSHOT_BARRIER (a test keeps them equal; this file imports nothing).
CDC_BARRIER_DATABASE = "lakehouse_meta"
CDC_BARRIER_TABLE = "cdc_snapshot_barrier"
CDC_BARRIER_DDL = (
    f"CREATE TABLE IF NOT EXISTS `{CDC_BARRIER_DATABASE}`.`{CDC_BARRIER_TABLE}` "
    "(id TINYINT PRIMARY KEY, written_at TIMESTAMP(6) NOT NULL)"
)


def cdc_grants(database: str) -> tuple[tuple[str, str], ...]:
    """(privileges, on what) for the CDC user: what RDS lets a user be given, and no more: read the
    binlog, SELECT the source database, write the barrier row. No RELOAD, LOCK TABLES or SUPER: the
    snapshot takes no lock."""
    quoted = "`" + database.replace("`", "``") + "`"
    return (
        ("REPLICATION SLAVE, REPLICATION CLIENT", "*.*"),
        ("SELECT", f"{quoted}.*"),
        ("SELECT, INSERT, UPDATE", f"`{CDC_BARRIER_DATABASE}`.`{CDC_BARRIER_TABLE}`"),
    )
