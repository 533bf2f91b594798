//! Pins the schema users get: every table and index as SQLite stores its DDL, and
//! the recorded migrations. A change here is a migration and must be reviewed.

use crate::common;

use rusqlite::Connection;

use common::TempDb;

#[tokio::test]
async fn schema_after_migrations() {
    let file = TempDb::new();
    drop(file.open().await);
    let conn = Connection::open(file.path()).expect("raw connection");
    let mut out = String::new();
    let mut stmt = conn
        .prepare(
            "SELECT type, name, sql FROM sqlite_master
             WHERE name NOT LIKE 'sqlite_%' ORDER BY type DESC, name",
        )
        .expect("prepare");
    let rows = stmt
        .query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, Option<String>>(2)?,
            ))
        })
        .expect("query");
    for row in rows {
        let (kind, name, sql) = row.expect("row");
        out.push_str(&format!(
            "-- {kind} {name}\n{};\n\n",
            sql.unwrap_or_default()
        ));
    }
    let mut stmt = conn
        .prepare("SELECT version, name FROM holdfast_schema ORDER BY version")
        .expect("prepare");
    let rows = stmt
        .query_map([], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?)))
        .expect("query");
    for row in rows {
        let (version, name) = row.expect("row");
        out.push_str(&format!("-- applied migration {version}: {name}\n"));
    }
    let mode: String = conn
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .expect("journal_mode");
    out.push_str(&format!("-- journal_mode: {mode}\n"));
    insta::assert_snapshot!(out);
}
