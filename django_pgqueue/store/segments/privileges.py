"""Owners, grants and comments: CREATE TABLE ... LIKE and a function made again copy none."""

from __future__ import annotations

from psycopg import sql

from django_pgqueue.store.segments.catalog import Conn, one_row


def copy_table_extras(conn: Conn, source: str, target: str, *, sequence: bool = True) -> None:
    """The owner, grants and comment of table ``source`` (and, with ``sequence``, the
    grants of its identity sequence) onto ``target``: LIKE copies none of them."""
    (owner, comment) = one_row(
        conn,
        "SELECT pg_get_userbyid(relowner), obj_description(oid, 'pg_class') FROM pg_class "
        "WHERE oid = %s::regclass",
        [source],
    )
    conn.execute(
        sql.SQL("ALTER TABLE {} OWNER TO {}").format(sql.Identifier(target), sql.Identifier(owner))
    )
    conn.execute(
        sql.SQL("COMMENT ON TABLE {} IS {}").format(sql.Identifier(target), sql.Literal(comment))
    )
    grant(conn, relation_grants(conn, source), "TABLE", sql.Identifier(target))
    if sequence:
        (name,) = one_row(conn, "SELECT pg_get_serial_sequence(%s, 'id')", [target])
        grant(conn, identity_sequence_grants(conn, source), "SEQUENCE", sql.SQL(name))


Grants = list[tuple[str | None, str, bool]]

ACL = (
    "SELECT CASE WHEN grant_.grantee = 0 THEN NULL ELSE pg_get_userbyid(grant_.grantee) END, "
    "grant_.privilege_type, grant_.is_grantable FROM {catalog}, aclexplode({acl}) AS grant_ "
    "WHERE {catalog}.oid = %s AND grant_.grantee <> {catalog}.{owner}"
)


def relation_grants(conn: Conn, relation: str) -> Grants:
    (oid,) = one_row(conn, "SELECT %s::regclass::oid", [relation])
    query = ACL.format(catalog="pg_class", acl="pg_class.relacl", owner="relowner")
    return [tuple(row) for row in conn.execute(query, [oid]).fetchall()]


def identity_sequence_grants(conn: Conn, table: str) -> Grants:
    (oid,) = one_row(conn, "SELECT pg_get_serial_sequence(%s, 'id')::regclass::oid", [table])
    query = ACL.format(catalog="pg_class", acl="pg_class.relacl", owner="relowner")
    return [tuple(row) for row in conn.execute(query, [oid]).fetchall()]


def function_grants(conn: Conn, signature: str) -> Grants | None:
    """The function's grants, or None when it has the default ones (PUBLIC may run it)."""
    (oid, acl) = one_row(
        conn, "SELECT oid, proacl FROM pg_proc WHERE oid = %s::regprocedure", [signature]
    )
    if acl is None:
        return None
    query = ACL.format(catalog="pg_proc", acl="pg_proc.proacl", owner="proowner")
    return [tuple(row) for row in conn.execute(query, [oid]).fetchall()]


def grant(conn: Conn, grants: Grants, kind: str, target: sql.Composable) -> None:
    for grantee, privilege, grantable in grants:
        conn.execute(
            sql.SQL("GRANT {} ON {} {} TO {}{}").format(
                sql.SQL(privilege),
                sql.SQL(kind),
                target,
                sql.SQL("PUBLIC") if grantee is None else sql.Identifier(grantee),
                sql.SQL(" WITH GRANT OPTION" if grantable else ""),
            )
        )


def recreate_function(conn: Conn, signature: str, definition: str, grants: Grants | None) -> None:
    conn.execute(definition)
    if grants is not None:
        target = sql.SQL(signature)
        conn.execute(sql.SQL("REVOKE ALL ON FUNCTION {} FROM PUBLIC").format(target))
        grant(conn, grants, "FUNCTION", target)
