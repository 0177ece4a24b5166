package layers

// The consumer built from small parts (docs/architecture.md, "The
// consumer's parts"): no part grows into a god type again, and its files
// refer to each other in one direction, from the assembly down to what the
// parts share, never back up in a loop.

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/kfpipe/kfpipe/internal/testenv"
)

// How big a type with behaviour may grow: issue 44's "~15 fields or ~25
// methods". A record without methods (an API answer's JSON shape) is held
// to no field bound.
const (
	maxFields  = 15
	maxMethods = 25
)

// smallParts are the packages held to those bounds: the consumer and the
// console, the two that had grown one type each doing everything.
var smallParts = []string{"internal/consumer", "internal/console"}

func TestPartsAreSmall(t *testing.T) {
	for _, dir := range smallParts {
		for _, ty := range sourceTypes(t, dir) {
			if (ty.methods > 0 && ty.fields > maxFields) || ty.methods > maxMethods {
				t.Errorf("%s: type %s has %d fields and %d methods (at most %d and %d): split it into parts with state of their own",
					dir, ty.name, ty.fields, ty.methods, maxFields, maxMethods)
			}
		}
	}
}

// TestConsumerFilesDoNotLoop: a file of internal/consumer refers to a name
// another file defines (a type, function, constant or variable, or a
// method no other file names) only when that file does not refer back to
// it, directly or through others. Loops are what made the old Consumer's
// files one type in ten files: a part's file that needs the assembly's, and
// the assembly's that needs it.
func TestConsumerFilesDoNotLoop(t *testing.T) {
	g := fileRefs(t, "internal/consumer")
	loops := g.inLoops()
	for _, l := range loops {
		t.Errorf("files refer to each other in a loop: %s", l)
	}
	t.Logf("internal/consumer: %d references between files, %d in loops", len(g), len(loops))
}

type typeSize struct {
	name            string
	fields, methods int
}

// sourceTypes returns the struct types of dir (relative to the module's
// root; tests left out) with their field and method counts.
func sourceTypes(t *testing.T, dir string) []typeSize {
	t.Helper()
	files := parseDir(t, dir)
	fields := map[string]int{}
	methods := map[string]int{}
	for _, f := range files {
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.GenDecl:
				for _, s := range d.Specs {
					ts, ok := s.(*ast.TypeSpec)
					if !ok {
						continue
					}
					st, ok := ts.Type.(*ast.StructType)
					if !ok {
						continue
					}
					n := 0
					for _, fl := range st.Fields.List {
						n += max(len(fl.Names), 1)
					}
					fields[ts.Name.Name] = n
				}
			case *ast.FuncDecl:
				if d.Recv != nil {
					methods[receiverName(d.Recv.List[0].Type)]++
				}
			}
		}
	}
	var out []typeSize
	for name, n := range fields {
		out = append(out, typeSize{name, n, methods[name]})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out
}

func receiverName(e ast.Expr) string {
	switch e := e.(type) {
	case *ast.StarExpr:
		return receiverName(e.X)
	case *ast.IndexExpr:
		return receiverName(e.X)
	case *ast.Ident:
		return e.Name
	}
	return ""
}

// parseDir parses dir's non-test Go files, by file name.
func parseDir(t *testing.T, dir string) map[string]*ast.File {
	t.Helper()
	names, err := filepath.Glob(filepath.Join(testenv.RepoRoot(t), dir, "*.go"))
	if err != nil || len(names) == 0 {
		t.Fatalf("no Go files in %s (%v)", dir, err)
	}
	fset := token.NewFileSet()
	files := map[string]*ast.File{}
	for _, n := range names {
		if strings.HasSuffix(n, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, n, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		files[filepath.Base(n)] = f
	}
	return files
}

// refGraph is which file refers to which, with the names it uses.
type refGraph map[[2]string][]string

// fileRefs reads which file of dir refers to a name another file of it
// defines. It reads names, not types: a package-level name is its
// declaration's file; a selector's name counts when it is an unexported
// method exactly one file defines (an exported one may be another
// package's). Field names and a composite literal's keys are no
// references.
func fileRefs(t *testing.T, dir string) refGraph {
	t.Helper()
	files := parseDir(t, dir)
	defs := map[string]string{}             // package-level name → file
	methods := map[string]map[string]bool{} // method name → files
	for name, f := range files {
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if d.Recv == nil {
					defs[d.Name.Name] = name
					continue
				}
				if methods[d.Name.Name] == nil {
					methods[d.Name.Name] = map[string]bool{}
				}
				methods[d.Name.Name][name] = true
			case *ast.GenDecl:
				for _, s := range d.Specs {
					switch s := s.(type) {
					case *ast.TypeSpec:
						defs[s.Name.Name] = name
					case *ast.ValueSpec:
						for _, n := range s.Names {
							defs[n.Name] = name
						}
					}
				}
			}
		}
	}
	g := refGraph{}
	add := func(from, to, what string) {
		if from != to {
			g[[2]string{from, to}] = append(g[[2]string{from, to}], what)
		}
	}
	for name, f := range files {
		imported := map[string]bool{}
		for _, im := range f.Imports {
			p := strings.Trim(im.Path.Value, `"`)
			n := p[strings.LastIndex(p, "/")+1:]
			if im.Name != nil {
				n = im.Name.Name
			}
			imported[n] = true
		}
		skip := map[*ast.Ident]bool{}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.SelectorExpr:
				skip[n.Sel] = true
				if id, ok := n.X.(*ast.Ident); ok && imported[id.Name] {
					skip[id] = true
					return true
				}
				if in := methods[n.Sel.Name]; len(in) == 1 && !ast.IsExported(n.Sel.Name) {
					for to := range in {
						add(name, to, n.Sel.Name)
					}
				}
			case *ast.Field:
				for _, id := range n.Names {
					skip[id] = true
				}
			case *ast.KeyValueExpr:
				if id, ok := n.Key.(*ast.Ident); ok {
					skip[id] = true
				}
			case *ast.Ident:
				if to, ok := defs[n.Name]; ok && !skip[n] {
					add(name, to, n.Name)
				}
			}
			return true
		})
	}
	return g
}

// inLoops returns the references whose target refers back to their
// source, directly or through other files, each with the names it uses.
func (g refGraph) inLoops() []string {
	next := map[string][]string{}
	for e := range g {
		next[e[0]] = append(next[e[0]], e[1])
	}
	reaches := func(from, to string) bool {
		seen := map[string]bool{from: true}
		for queue := []string{from}; len(queue) > 0; queue = queue[1:] {
			if queue[0] == to {
				return true
			}
			for _, n := range next[queue[0]] {
				if !seen[n] {
					seen[n] = true
					queue = append(queue, n)
				}
			}
		}
		return false
	}
	var out []string
	for e, names := range g {
		if reaches(e[1], e[0]) {
			seen := map[string]bool{}
			var uniq []string
			for _, n := range names {
				if !seen[n] {
					seen[n] = true
					uniq = append(uniq, n)
				}
			}
			out = append(out, fmt.Sprintf("%s -> %s (%s)", e[0], e[1], strings.Join(uniq, ", ")))
		}
	}
	sort.Strings(out)
	return out
}
