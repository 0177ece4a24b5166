package testenv

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Two tests' DSNs land in two schemas: a table one creates is not seen by
// the other.
func TestPostgresSchemaPerTest(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	a, err := pgx.Connect(ctx, Postgres(t))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close(ctx)
	b, err := pgx.Connect(ctx, Postgres(t))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close(ctx)
	if _, err := a.Exec(ctx, "CREATE TABLE probe (x int)"); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := b.QueryRow(ctx, "SELECT count(*) FROM information_schema.tables WHERE table_name = 'probe' AND table_schema = current_schema()").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("second schema sees the first one's table")
	}
	if err := a.QueryRow(ctx, "SELECT count(*) FROM information_schema.tables WHERE table_name = 'probe' AND table_schema = current_schema()").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Fatalf("own schema: %d probe tables, want 1", n)
	}
}
