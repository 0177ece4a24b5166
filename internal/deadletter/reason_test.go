package deadletter

import (
	"bufio"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// repoRoot is the module root, two levels above this package.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("module root not found at %s: %v", root, err)
	}
	return root
}

func TestTableRows(t *testing.T) {
	for _, row := range Rows() {
		if row.Reason == "" || row.Action == "" || row.Strategy == "" || row.Doc == "" {
			t.Errorf("row %q has an empty column: %+v", row.Reason, row)
		}
		if row.MaxRetries < 0 || row.MaxRetries > 1000 {
			t.Errorf("row %q: default max retries %d outside [0, 1000] (recovery.max_retries bound)", row.Reason, row.MaxRetries)
		}
		if !row.Recoverable && (row.Strategy != StrategyNever || row.MaxRetries != 0) {
			t.Errorf("row %q is not recoverable but has strategy %s and %d retries", row.Reason, row.Strategy, row.MaxRetries)
		}
		if _, err := Parse(string(row.Reason)); err != nil {
			t.Error(err)
		}
	}
	if _, err := Parse("rate_limitd"); err == nil || !strings.Contains(err.Error(), "rate_limited") {
		t.Errorf("Parse of an unknown reason: %v, want an error listing the known ones", err)
	}
}

// The policies the table replaced (switches in dlq) still hold.
func TestPoliciesMatchSeed(t *testing.T) {
	cases := []struct {
		r           Reason
		group       string
		recoverable bool
		priority    int
		action      Action
	}{
		{InvalidMessage, "normal", false, 5, ActionManualReview},
		{RateLimited, "normal", true, 4, ActionDelayedRetry},
		{UserBlocked, "normal", true, 2, ActionDelayedRetry},
		{UserBlocked, "vip", true, 5, ActionDelayedRetry},
		{CircuitOpen, "vip", true, 8, ActionDelayedRetry},
		{SystemOverload, "normal", true, 5, ActionDelayedRetry},
		{QueueFull, "normal", true, 5, ActionDelayedRetry},
		{DownstreamError, "normal", true, 5, ActionAutoRetry},
		{ProcessTimeout, "normal", true, 5, ActionAutoRetry},
		{KafkaFailure, "normal", true, 5, ActionAutoRetry},
		{Reason("from_a_newer_writer"), "vip", true, 8, ActionAutoRetry},
	}
	for _, c := range cases {
		if got := IsRecoverable(c.r); got != c.recoverable {
			t.Errorf("IsRecoverable(%s) = %v, want %v", c.r, got, c.recoverable)
		}
		if got := CalculatePriority(c.group, c.r); got != c.priority {
			t.Errorf("CalculatePriority(%s, %s) = %d, want %d", c.group, c.r, got, c.priority)
		}
		if got := SuggestAction(c.r); got != c.action {
			t.Errorf("SuggestAction(%s) = %s, want %s", c.r, got, c.action)
		}
	}
}

// reasonPackages are the packages that emit, convert or configure reasons;
// in them a reason's name as a string literal is an error (use the
// constant, so that a reason the table lacks does not compile).
var reasonPackages = []string{"internal/config", "internal/consumer", "internal/dlq", "internal/ratelimit", "internal/service", "internal/console/sources"}

// TestNoReasonOutsideTable scans the production code: every Reason…
// constant is defined from this package, every Reason field or conversion
// given a literal names a known reason, and the packages that deal in
// reasons spell none as a literal.
func TestNoReasonOutsideTable(t *testing.T) {
	root := repoRoot(t)
	known := map[string]bool{}
	for _, n := range Names() {
		known[n] = true
	}
	strict := map[string]bool{}
	for _, p := range reasonPackages {
		strict[filepath.Join(root, p)] = true
	}
	fset := token.NewFileSet()
	scanned := 0
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			name := d.Name()
			if path != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "vendor" || name == "node_modules") {
				return filepath.SkipDir
			}
			if path == filepath.Join(root, "internal", "deadletter") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		scanned++
		inStrict := false
		for dir := filepath.Dir(path); len(dir) >= len(root); dir = filepath.Dir(dir) {
			if strict[dir] {
				inStrict = true
				break
			}
		}
		checkFile(t, fset, f, known, inStrict)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if scanned < 50 {
		t.Fatalf("scanned only %d files; is %s the module root?", scanned, root)
	}
}

func checkFile(t *testing.T, fset *token.FileSet, f *ast.File, known map[string]bool, strict bool) {
	t.Helper()
	lit := func(e ast.Expr) (string, bool) {
		b, ok := e.(*ast.BasicLit)
		if !ok || b.Kind != token.STRING {
			return "", false
		}
		s, err := strconv.Unquote(b.Value)
		return s, err == nil
	}
	checkLit := func(e ast.Expr, what string) {
		if s, ok := lit(e); ok && s != "" && !known[s] {
			t.Errorf("%s: %s %q is not in the reason table (internal/deadletter)", fset.Position(e.Pos()), what, s)
		}
	}
	isReasonType := func(e ast.Expr) bool {
		switch x := e.(type) {
		case *ast.Ident:
			return x.Name == "Reason"
		case *ast.SelectorExpr:
			return x.Sel.Name == "Reason"
		}
		return false
	}
	ast.Inspect(f, func(n ast.Node) bool {
		switch x := n.(type) {
		case *ast.GenDecl:
			if x.Tok != token.CONST {
				return true
			}
			for _, spec := range x.Specs {
				vs := spec.(*ast.ValueSpec)
				for i, name := range vs.Names {
					if !strings.HasPrefix(name.Name, "Reason") || i >= len(vs.Values) {
						continue
					}
					if !refersToTable(vs.Values[i]) {
						t.Errorf("%s: constant %s is not defined from the reason table (write it as deadletter.X)", fset.Position(name.Pos()), name.Name)
					}
				}
			}
		case *ast.CallExpr:
			if isReasonType(x.Fun) && len(x.Args) == 1 {
				checkLit(x.Args[0], "conversion to Reason of")
			}
		case *ast.KeyValueExpr:
			if k, ok := x.Key.(*ast.Ident); ok && k.Name == "Reason" {
				checkLit(x.Value, "Reason field set to")
			}
		case *ast.AssignStmt:
			for i, l := range x.Lhs {
				if s, ok := l.(*ast.SelectorExpr); ok && s.Sel.Name == "Reason" && i < len(x.Rhs) {
					checkLit(x.Rhs[i], "Reason field set to")
				}
			}
		case *ast.BasicLit:
			if s, ok := lit(x); ok && strict && known[s] {
				t.Errorf("%s: reason %q spelled as a literal; use the deadletter constant (or its alias)", fset.Position(x.Pos()), s)
			}
		}
		return true
	})
}

// refersToTable reports whether e mentions the deadletter package.
func refersToTable(e ast.Expr) bool {
	found := false
	ast.Inspect(e, func(n ast.Node) bool {
		if s, ok := n.(*ast.SelectorExpr); ok {
			if id, ok := s.X.(*ast.Ident); ok && id.Name == "deadletter" {
				found = true
			}
		}
		return !found
	})
	return found
}

// TestOperationsDocListsTheTable parses the reasons table of
// docs/operations.md and compares it row by row with the code's.
func TestOperationsDocListsTheTable(t *testing.T) {
	path := filepath.Join(repoRoot(t), "docs", "operations.md")
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var rows [][]string
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(line, "#") {
			in = line == "## Dead-letter reasons"
			continue
		}
		if !in || !strings.HasPrefix(line, "|") {
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		for i := range cells {
			cells[i] = strings.Trim(strings.TrimSpace(cells[i]), "`")
		}
		if cells[0] == "reason" || strings.HasPrefix(cells[0], "---") {
			continue
		}
		rows = append(rows, cells)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	strategy := map[Strategy]string{StrategyBackoff: "backoff", StrategyAfterBlock: "after block", StrategyNever: "never"}
	yesNo := map[bool]string{true: "yes", false: "no"}
	table := Rows()
	if len(rows) != len(table) {
		t.Errorf("%s lists %d reasons under \"## Dead-letter reasons\", the table has %d", path, len(rows), len(table))
	}
	for i := 0; i < len(rows) && i < len(table); i++ {
		r, doc := table[i], rows[i]
		want := []string{string(r.Reason), yesNo[r.Recoverable], strconv.Itoa(r.Priority), string(r.Action),
			strategy[r.Strategy], strconv.Itoa(r.MaxRetries), yesNo[r.PastLimiter]}
		if len(doc) < len(want) {
			t.Errorf("%s row %d has %d columns: %q", path, i+1, len(doc), doc)
			continue
		}
		for j, w := range want {
			if doc[j] != w {
				t.Errorf("%s row %d (%s) column %d = %q, the table says %q", path, i+1, r.Reason, j+1, doc[j], w)
			}
		}
	}
}
