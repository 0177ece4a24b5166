package testenv

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// EnvPostgres is the PostgreSQL scripts/postgres.sh starts, as a DSN
// (postgres://kfpipe@127.0.0.1:15432/kfpipe?sslmode=disable).
const EnvPostgres = "KFPIPE_TEST_POSTGRES"

// PostgresDSN returns the test PostgreSQL's DSN, checked to answer.
func PostgresDSN(t testing.TB) string {
	t.Helper()
	dsn := os.Getenv(EnvPostgres)
	if dsn == "" {
		missing(t, "PostgreSQL", fmt.Errorf("%s not set", EnvPostgres))
	}
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatalf("%s: %v", EnvPostgres, err)
	}
	if err := reachable(u.Host); err != nil {
		missing(t, "PostgreSQL at "+u.Host, err)
	}
	return dsn
}

// Postgres returns a DSN on the test PostgreSQL whose search_path is a
// fresh schema of its own, so tests never see each other's tables; the
// schema is dropped at cleanup.
func Postgres(t testing.TB) string {
	t.Helper()
	dsn := PostgresDSN(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		missing(t, "PostgreSQL", err)
	}
	defer conn.Close(ctx)
	schema := strings.ReplaceAll(strings.ToLower(Name(t, "pg")), "-", "_")
	if len(schema) > 63 {
		schema = schema[:50] + "_" + Short()
	}
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
		t.Fatalf("create schema %s: %v", schema, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Logf("drop schema %s: %v", schema, err)
			return
		}
		defer c.Close(ctx)
		if _, err := c.Exec(ctx, "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
			t.Logf("drop schema %s: %v", schema, err)
		}
	})
	sep := "?"
	if strings.Contains(dsn, "?") {
		sep = "&"
	}
	return dsn + sep + "search_path=" + schema
}
