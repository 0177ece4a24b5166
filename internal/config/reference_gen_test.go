package config

// The generator of docs/config.md: a test helper, not a part of the
// daemons (it parses the package sources for the fields' doc comments).
// `make config-docs` runs TestReferenceUpToDate with -update.

import (
	"bytes"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"sort"
	"strings"

	"github.com/kfpipe/kfpipe/internal/config/schema"
)

// module is this module's path: a type's package path below it is its
// directory.
const module = "github.com/kfpipe/kfpipe"

// daemonSchema is one daemon: its name, and its configuration's defaults
// by environment.
type daemonSchema struct {
	name     string
	defaults func(env string) any
}

var daemonSchemas = []daemonSchema{
	{"kf-producer", func(env string) any { return defaultProducer(env) }},
	{"schedule-consumer", func(env string) any { return defaultConsumer(env) }},
	{"dlq-consumer", func(env string) any { return defaultDLQConsumer(env) }},
}

var envs = []string{EnvDevelopment, EnvTest, EnvProduction}

// refRow is one key of the reference.
type refRow struct {
	key, typ, def, bounds, readBy, meaning string
}

// Reference renders docs/config.md from the schema itself: every key of
// the three daemons' configurations with its type, its default (the
// tags' and the environment's, read from the daemons' default
// configurations), its bounds (the range and enum tags), the daemons
// that read it, and its meaning (the field's doc comment, read from the
// source under root, the module's root directory). It fails, naming
// them, when a key has no doc comment.
func Reference(root string) ([]byte, error) {
	docs := docComments{root: root, types: map[string]*typeDocs{}}
	var rows []refRow
	var sections []string
	sectionDoc := map[string]string{}
	var missing []string
	add := func(r refRow) {
		if r.meaning == "" {
			missing = append(missing, r.key)
		}
		rows = append(rows, r)
	}
	var walk func(prefix string, t reflect.Type)
	walk = func(prefix string, t reflect.Type) {
		for i := 0; i < t.NumField(); i++ {
			f := t.Field(i)
			key, squash, ok := schema.Key(f)
			if !ok {
				continue
			}
			if squash {
				walk(prefix, f.Type)
				continue
			}
			key = schema.Join(prefix, key)
			doc, err := docs.field(t, f.Name)
			if err != nil {
				panic(err) // the source of a schema type is missing: not a key's fault
			}
			meaning := meaningOf(doc, f.Name, leaf(key))
			if prefix == "" && f.Type.Kind() == reflect.Struct {
				sections = append(sections, key)
				td, _ := docs.typeDoc(f.Type)
				// Its first paragraph: what follows is for programmers.
				td, _, _ = strings.Cut(td, "\n\n")
				sectionDoc[key] = meaningOf(td, f.Type.Name(), key)
			} else if prefix == "" {
				sections = append(sections, key)
			}
			// Below a map or a list the keys are data; the daemons that
			// read them are those that read the map or list.
			schemaKey := key
			if i := strings.IndexAny(key, "<["); i >= 0 {
				schemaKey = strings.TrimSuffix(key[:i], ".")
			}
			switch {
			case f.Type.Kind() == reflect.Struct:
				walk(key, f.Type)
				continue
			case f.Type.Kind() == reflect.Map && f.Type.Elem().Kind() == reflect.Struct:
				add(refRow{key: key, typ: "map of name → " + leaf(key), def: defaultOf(key), bounds: "—", readBy: readBy(schemaKey), meaning: meaning})
				walk(key+".<name>", f.Type.Elem())
				continue
			case f.Type.Kind() == reflect.Slice && f.Type.Elem().Kind() == reflect.Struct:
				add(refRow{key: key, typ: "list of " + fieldList(f.Type.Elem()), def: defaultOf(key), bounds: "—", readBy: readBy(schemaKey), meaning: meaning})
				walk(key+"[]", f.Type.Elem())
				continue
			}
			def := "—"
			if !strings.ContainsAny(key, "<[") {
				def = defaultOf(key)
			}
			add(refRow{key: key, typ: typeName(f.Type), def: def, bounds: boundsOf(f), readBy: readBy(schemaKey), meaning: meaning})
		}
	}
	walk("", reflect.TypeOf(union{}))
	if len(missing) > 0 {
		return nil, fmt.Errorf("%d key(s) without a doc comment on their field (write one; it is the key's meaning in %s): %s",
			len(missing), ReferencePath, strings.Join(missing, ", "))
	}
	return render(rows, sections, sectionDoc), nil
}

func leaf(key string) string { return key[strings.LastIndexByte(key, '.')+1:] }

// readBy names the daemons whose configuration has key.
func readBy(key string) string {
	var by []string
	for _, d := range daemonSchemas {
		if _, ok := valueAt(reflect.ValueOf(d.defaults(EnvDevelopment)), key); ok {
			by = append(by, d.name)
		}
	}
	if len(by) == len(daemonSchemas) {
		return "all"
	}
	return strings.Join(by, ", ")
}

// valueAt finds key in a configuration value; ok is false when the
// configuration has no such key.
func valueAt(rv reflect.Value, key string) (reflect.Value, bool) {
	parts := strings.Split(key, ".")
next:
	for len(parts) > 0 {
		if rv.Kind() != reflect.Struct {
			return rv, false
		}
		rt := rv.Type()
		for i := 0; i < rt.NumField(); i++ {
			k, squash, ok := schema.Key(rt.Field(i))
			if !ok {
				continue
			}
			if squash {
				if v, ok := valueAt(rv.Field(i), strings.Join(parts, ".")); ok {
					return v, true
				}
				continue
			}
			if k == parts[0] {
				rv, parts = rv.Field(i), parts[1:]
				continue next
			}
		}
		return rv, false
	}
	return rv, true
}

// defaultOf renders key's default in every environment and daemon that
// reads it: one value when they agree, else the development value and
// the environments that differ, or each daemon's.
func defaultOf(key string) string {
	if key == "env" { // each environment's defaults name it; unset, it is development
		return "`" + EnvDevelopment + "`"
	}
	type at struct{ env, daemon string }
	vals := map[at]string{}
	var daemons []string
	for _, d := range daemonSchemas {
		for _, env := range envs {
			v, ok := valueAt(reflect.ValueOf(d.defaults(env)), key)
			if !ok {
				break
			}
			vals[at{env, d.name}] = docValue(v)
		}
		if _, ok := vals[at{EnvDevelopment, d.name}]; ok {
			daemons = append(daemons, d.name)
		}
	}
	byEnv, byDaemon := true, true
	for _, env := range envs {
		for _, d := range daemons {
			if vals[at{env, d}] != vals[at{env, daemons[0]}] {
				byEnv = false
			}
			if vals[at{env, d}] != vals[at{EnvDevelopment, d}] {
				byDaemon = false
			}
		}
	}
	first := vals[at{EnvDevelopment, daemons[0]}]
	switch {
	case byEnv && byDaemon:
		return first
	case byEnv:
		var other []string
		for _, env := range envs[1:] {
			if v := vals[at{env, daemons[0]}]; v != first {
				other = append(other, env+": "+v)
			}
		}
		return first + " (" + strings.Join(other, "; ") + ")"
	case byDaemon:
		var each []string
		for _, d := range daemons {
			each = append(each, d+": "+vals[at{EnvDevelopment, d}])
		}
		return strings.Join(each, "; ")
	}
	var each []string
	for _, env := range envs {
		for _, d := range daemons {
			each = append(each, env+" "+d+": "+vals[at{env, d}])
		}
	}
	return strings.Join(each, "; ")
}

// docValue renders a default for the reference.
func docValue(v reflect.Value) string {
	switch v.Kind() {
	case reflect.Map:
		if v.Len() == 0 {
			return "empty"
		}
		keys := v.MapKeys()
		sort.Slice(keys, func(i, j int) bool { return keys[i].String() < keys[j].String() })
		var items []string
		for _, k := range keys {
			e := v.MapIndex(k)
			if e.Kind() == reflect.Struct {
				var fields []string
				for i := 0; i < e.NumField(); i++ {
					name, _, _ := schema.Key(e.Type().Field(i))
					fields = append(fields, name+" "+short(schema.Format(e.Field(i))))
				}
				items = append(items, k.String()+": "+strings.Join(fields, ", "))
				continue
			}
			items = append(items, k.String()+" "+short(schema.Format(e)))
		}
		return "`" + strings.Join(items, "`; `") + "`"
	case reflect.Slice:
		if v.Len() == 0 {
			return "empty"
		}
		var items []string
		for i := 0; i < v.Len(); i++ {
			items = append(items, fmt.Sprint(v.Index(i).Interface()))
		}
		return "`" + strings.Join(items, ",") + "`"
	case reflect.String:
		s := v.String()
		if s == "" {
			return "empty"
		}
		// The test environment's media directory is under the system's
		// temporary directory, which differs by machine.
		if tmp := os.TempDir(); strings.HasPrefix(s, tmp+string(filepath.Separator)) {
			s = "$TMPDIR" + s[len(tmp):]
		}
		return "`" + s + "`"
	}
	return "`" + short(schema.Format(v)) + "`"
}

var (
	hours   = regexp.MustCompile(`\b(\d+h)0m0s\b`)
	minutes = regexp.MustCompile(`\b(\d+m)0s\b`)
	zero    = regexp.MustCompile(`\b0s\b`)
)

// short drops a duration's zero minutes and seconds: 5m, 168h, 0.
func short(s string) string {
	return zero.ReplaceAllString(minutes.ReplaceAllString(hours.ReplaceAllString(s, "$1"), "$1"), "0")
}

func boundsOf(f reflect.StructField) string {
	var out []string
	if e := schema.Enum(f); e != nil {
		out = append(out, "`"+strings.Join(e, "`, `")+"`")
	}
	r, ok, err := names.ParseRange(f)
	if err != nil {
		panic(fmt.Sprintf("%s: %v", f.Name, err))
	}
	if ok {
		s := strings.TrimPrefix(short(r.String()), "in ")
		out = append(out, strings.Replace(s, " or in ", " or ", 1))
	}
	if len(out) == 0 {
		return "—"
	}
	return strings.Join(out, "; ")
}

func typeName(t reflect.Type) string {
	switch {
	case t == reflect.TypeOf(DefaultSessionTimeout):
		return "duration"
	case t.Kind() == reflect.Map:
		return "map of name → " + typeName(t.Elem())
	case t.Kind() == reflect.Slice:
		return "list of " + typeName(t.Elem()) + "s"
	case t.Kind() >= reflect.Int && t.Kind() <= reflect.Int64:
		return "int"
	case t.Kind() == reflect.Float64:
		return "float"
	}
	return t.Kind().String()
}

func fieldList(t reflect.Type) string {
	var keys []string
	for i := 0; i < t.NumField(); i++ {
		if k, _, ok := schema.Key(t.Field(i)); ok {
			keys = append(keys, k)
		}
	}
	return "{" + strings.Join(keys, ", ") + "}"
}

// meaningOf makes a doc comment one line of a table cell: joined, the Go
// name it starts with replaced by the key's.
func meaningOf(doc, goName, key string) string {
	s := strings.Join(strings.Fields(doc), " ")
	if rest, ok := strings.CutPrefix(s, goName); ok && (rest == "" || strings.ContainsAny(rest[:1], " :,")) {
		s = "`" + key + "`" + rest
	}
	return strings.ReplaceAll(s, "|", "\\|")
}

// docComments reads the doc comments of the schema's types from their
// source.
type docComments struct {
	root  string
	types map[string]*typeDocs // by package path and name
	read  map[string]bool      // packages parsed
}

type typeDocs struct {
	doc    string
	fields map[string]string
}

func (d *docComments) load(pkg string) error {
	if d.read == nil {
		d.read = map[string]bool{}
	}
	if d.read[pkg] {
		return nil
	}
	d.read[pkg] = true
	rel, ok := strings.CutPrefix(pkg, module+"/")
	if !ok {
		return fmt.Errorf("schema type of package %s, outside %s", pkg, module)
	}
	dir := filepath.Join(d.root, filepath.FromSlash(rel))
	fset := token.NewFileSet()
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
			continue
		}
		file, err := parser.ParseFile(fset, filepath.Join(dir, e.Name()), nil, parser.ParseComments)
		if err != nil {
			return err
		}
		for _, decl := range file.Decls {
			gd, ok := decl.(*ast.GenDecl)
			if !ok || gd.Tok != token.TYPE {
				continue
			}
			for _, spec := range gd.Specs {
				ts := spec.(*ast.TypeSpec)
				st, ok := ts.Type.(*ast.StructType)
				if !ok {
					continue
				}
				td := &typeDocs{doc: ts.Doc.Text(), fields: map[string]string{}}
				if td.doc == "" {
					td.doc = gd.Doc.Text()
				}
				for _, f := range st.Fields.List {
					text := f.Doc.Text()
					if text == "" {
						text = f.Comment.Text()
					}
					for _, n := range f.Names {
						td.fields[n.Name] = text
					}
				}
				d.types[pkg+"."+ts.Name.Name] = td
			}
		}
	}
	return nil
}

func (d *docComments) typeDoc(t reflect.Type) (string, error) {
	if err := d.load(t.PkgPath()); err != nil {
		return "", err
	}
	if td := d.types[t.PkgPath()+"."+t.Name()]; td != nil {
		return td.doc, nil
	}
	return "", nil
}

func (d *docComments) field(t reflect.Type, name string) (string, error) {
	if t.Name() == "" { // an anonymous struct: no source of its own
		return "", nil
	}
	if err := d.load(t.PkgPath()); err != nil {
		return "", err
	}
	td := d.types[t.PkgPath()+"."+t.Name()]
	if td == nil {
		return "", fmt.Errorf("type %s.%s not found in its source", t.PkgPath(), t.Name())
	}
	return td.fields[name], nil
}

func render(rows []refRow, sections []string, sectionDoc map[string]string) []byte {
	var b bytes.Buffer
	b.WriteString(`# Configuration reference

<!-- Generated from internal/config's schema by ` + "`make config-docs`" + `.
     Do not edit: change the field's doc comment or tags and regenerate. -->

Every key each daemon reads, generated from the configuration's types: the meaning is the
field's doc comment, the default and the bounds are its tags (` + "`default`, `range`, `zero`, `enum`" + `;
internal/config/schema), plus the few defaults that depend on the environment (` + "`env`" + `) or
the daemon. One YAML file may serve all three daemons; each reads its keys and ignores the
others' keys, but a key no daemon reads is an error at start. Every key can be set from the
environment: ` + "`KFPIPE_`" + ` and the key in capitals, dots as underscores
(` + "`kafka.consumer.session_timeout`" + ` is ` + "`KFPIPE_KAFKA_CONSUMER_SESSION_TIMEOUT`" + `), and the environment
wins over the file. The shipped files (config/*.yaml) set only what differs from these defaults.

Bounds are checked at start, before anything connects, and every error names the key.
Rules between keys (say, ` + "`processor.resume_below`" + ` below ` + "`processor.max_in_flight`" + `) are stated
in the key's meaning. Durations are Go durations (` + "`500ms`, `30s`, `5m`, `168h`" + `); "read by"
names the daemons whose configuration has the key ("all": the three).

`)
	bySection := map[string][]refRow{}
	for _, r := range rows {
		s := strings.SplitN(r.key, ".", 2)[0]
		s = strings.SplitN(s, "[", 2)[0]
		bySection[s] = append(bySection[s], r)
	}
	for _, s := range sections {
		fmt.Fprintf(&b, "## %s\n\n", s)
		if d := sectionDoc[s]; d != "" {
			b.WriteString(d + "\n\n")
		}
		b.WriteString("| key | type | default | bounds | read by | meaning |\n| --- | --- | --- | --- | --- | --- |\n")
		for _, r := range bySection[s] {
			fmt.Fprintf(&b, "| `%s` | %s | %s | %s | %s | %s |\n", r.key, r.typ, r.def, r.bounds, r.readBy, r.meaning)
		}
		b.WriteString("\n")
	}
	return append(bytes.TrimRight(b.Bytes(), "\n"), '\n')
}
