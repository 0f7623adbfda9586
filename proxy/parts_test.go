package proxy_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
)

// The parts below the decision (doc.go, "A message's route") use nothing of
// the parts above them: no file below names a type, function, variable or
// constant declared in a file above. A method of a part above could only be
// reached through a value of its type, which would have to be named, so the
// names declared at the top of each file are enough to keep the parts in
// their order.
var (
	below = []string{
		"ending.go", "settle.go", "references.go", "backoff.go", // how a delivery ends, and the settler
		"send.go", "inflight.go", "routes.go", "timeout.go", "request.go", // the one send path
		"delivery.go", "tracker.go", "sourced.go", // what travels, and its tracking
		"given.go", "options.go", "phases.go", "cause.go", "metrics.go", "log.go", "trace.go",
	}
	above = []string{
		"proxy.go", "holds.go", "decide.go", "checkkey.go", "handoff.go", "batcher.go", "summary.go", "state.go",
		"hold.go", "gate.go", "breaker.go",
		"source.go", "fetch.go", "pin.go", "takeover.go", "order.go", "ordermarks.go", "partition.go",
	}
)

func TestPartsBelowTheDecisionUseNothingAbove(t *testing.T) {
	// Each file parsed alone: what it names from the package's other files
	// is left unresolved.
	paths, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	files := map[string]*ast.File{}
	for _, p := range paths {
		if strings.HasSuffix(p, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, p, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		files[p] = f
	}
	for name := range files {
		if name != "doc.go" && !slices.Contains(below, name) && !slices.Contains(above, name) {
			t.Errorf("%s is in neither list: say whether it is below the decision or above", name)
		}
	}
	declaredAbove := map[string]string{}
	for _, name := range above {
		f := files[name]
		if f == nil {
			t.Fatalf("%s is listed above but not in the package", name)
		}
		for _, n := range topLevelNames(f) {
			declaredAbove[n] = name
		}
	}
	for _, name := range below {
		f := files[name]
		if f == nil {
			t.Fatalf("%s is listed below but not in the package", name)
		}
		keys := literalKeys(f)
		var uses []string
		for _, id := range f.Unresolved {
			if from, ok := declaredAbove[id.Name]; ok && !keys[id] {
				uses = append(uses, id.Name+" ("+from+")")
			}
		}
		sort.Strings(uses)
		if len(uses) > 0 {
			t.Errorf("%s, below the decision, uses %s from above it", name, strings.Join(slices.Compact(uses), ", "))
		}
	}
}

// topLevelNames are the types, functions, variables and constants f
// declares at the top (not methods: they are reached through their type).
func topLevelNames(f *ast.File) []string {
	var names []string
	for _, decl := range f.Decls {
		switch d := decl.(type) {
		case *ast.FuncDecl:
			if d.Recv == nil {
				names = append(names, d.Name.Name)
			}
		case *ast.GenDecl:
			for _, spec := range d.Specs {
				switch s := spec.(type) {
				case *ast.TypeSpec:
					names = append(names, s.Name.Name)
				case *ast.ValueSpec:
					for _, n := range s.Names {
						names = append(names, n.Name)
					}
				}
			}
		}
	}
	return names
}

// literalKeys are the keys of f's composite literals: the parser cannot
// tell a struct field's name there from a name it must resolve.
func literalKeys(f *ast.File) map[*ast.Ident]bool {
	keys := map[*ast.Ident]bool{}
	ast.Inspect(f, func(n ast.Node) bool {
		if kv, ok := n.(*ast.KeyValueExpr); ok {
			if id, ok := kv.Key.(*ast.Ident); ok {
				keys[id] = true
			}
		}
		return true
	})
	return keys
}
