package main

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestNoBehaviourNumbers: no doc, comment or message in the repo points the
// reader at a numbered behaviour (the word followed by a number): the list
// those numbers come from is not in the repo, so the reader cannot follow
// them. Words, or a link to a section the repo holds, say it instead.
func TestNoBehaviourNumbers(t *testing.T) {
	numbered := regexp.MustCompile(`(?i)\bbehaviou?rs?\s+\d`)
	root := "../.."
	checked := 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != root && (strings.HasPrefix(name, ".") || name == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		switch filepath.Ext(path) {
		case ".go", ".md", ".yaml", ".yml", ".json", ".sh", ".txt":
		default:
			if d.Name() != "Dockerfile" {
				return nil
			}
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		checked++
		for i, line := range strings.Split(string(b), "\n") {
			if numbered.MatchString(line) {
				rel, _ := filepath.Rel(root, path)
				t.Errorf("%s:%d: %s", rel, i+1, strings.TrimSpace(line))
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 50 {
		t.Fatalf("only %d files checked: is %s the repo?", checked, root)
	}
}

// TestBehaviourDoc keeps docs/behaviour.md true to the repo: every section
// names the tests that hold its promise, every test it names exists, and
// every link to one of its sections, anywhere in the repo, lands on one.
func TestBehaviourDoc(t *testing.T) {
	const root, doc = "../..", "docs/behaviour.md"
	b, err := os.ReadFile(filepath.Join(root, doc))
	if err != nil {
		t.Fatal(err)
	}
	anchors := map[string]bool{}
	section, held := "", true
	for line := range strings.Lines(string(b)) {
		if h, ok := strings.CutPrefix(line, "## "); ok {
			if !held {
				t.Errorf("%s: section %q names no test (Held by: ...)", doc, section)
			}
			section, held = strings.TrimSpace(h), false
			anchors[githubAnchor(section)] = true
		}
		held = held || strings.HasPrefix(line, "Held by: ")
	}
	if !held {
		t.Errorf("%s: section %q names no test (Held by: ...)", doc, section)
	}
	if len(anchors) < 20 {
		t.Fatalf("%s: only %d sections", doc, len(anchors))
	}

	tests := map[string]bool{}
	testFunc := regexp.MustCompile(`(?m)^func (Test\w+)\(`)
	link := regexp.MustCompile(`behaviour\.md#([\w-]+)`)
	links := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != root && strings.HasPrefix(d.Name(), ".") {
				return filepath.SkipDir
			}
			return nil
		}
		switch filepath.Ext(path) {
		case ".go", ".md", ".yaml", ".yml", ".json":
		default:
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if strings.HasSuffix(path, "_test.go") {
			for _, m := range testFunc.FindAllStringSubmatch(string(b), -1) {
				tests[m[1]] = true
			}
		}
		rel, _ := filepath.Rel(root, path)
		for _, m := range link.FindAllStringSubmatch(string(b), -1) {
			links++
			if !anchors[m[1]] {
				t.Errorf("%s links to %s#%s, which is no section of it", rel, doc, m[1])
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	named := regexp.MustCompile("`(Test\\w+)`").FindAllStringSubmatch(string(b), -1)
	for _, m := range named {
		if !tests[m[1]] {
			t.Errorf("%s names %s, which is no test in the repo", doc, m[1])
		}
	}
	if len(named) < 50 || links == 0 {
		t.Errorf("%d tests named in %s, %d links to it: is %s the repo?", len(named), doc, links, root)
	}
}

// githubAnchor is the anchor GitHub gives a Markdown heading: lower case,
// punctuation dropped, spaces made hyphens.
func githubAnchor(heading string) string {
	a := regexp.MustCompile(`[^a-z0-9 _-]`).ReplaceAllString(strings.ToLower(heading), "")
	return strings.ReplaceAll(a, " ", "-")
}

// TestDocLinks: every relative link of the README and docs/ lands on a file
// or directory of the repo and, when it names a section of a Markdown file,
// on one of its headings.
func TestDocLinks(t *testing.T) {
	const root = "../.."
	files := docFiles(t)
	link := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	anchorsOf := map[string]map[string]bool{}
	anchors := func(path string) map[string]bool {
		if a, ok := anchorsOf[path]; ok {
			return a
		}
		a := map[string]bool{}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		inFence := false
		for line := range strings.Lines(string(b)) {
			if strings.HasPrefix(line, "```") {
				inFence = !inFence
			}
			if h, ok := strings.CutPrefix(line, "#"); ok && !inFence {
				base := githubAnchor(strings.TrimSpace(strings.TrimLeft(h, "#")))
				id := base
				for n := 1; a[id]; n++ { // GitHub numbers repeated headings
					id = fmt.Sprintf("%s-%d", base, n)
				}
				a[id] = true
			}
		}
		anchorsOf[path] = a
		return a
	}
	checked := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root, f)
		inFence := false
		for i, line := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(line, "```") {
				inFence = !inFence
			}
			if inFence {
				continue
			}
			for _, m := range link.FindAllStringSubmatch(line, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				checked++
				path, anchor, _ := strings.Cut(target, "#")
				dest := f
				if path != "" {
					dest = filepath.Join(filepath.Dir(f), path)
				}
				if _, err := os.Stat(dest); err != nil {
					t.Errorf("%s:%d: %s: no such file in the repo", rel, i+1, target)
					continue
				}
				if anchor != "" && strings.HasSuffix(dest, ".md") && !anchors(dest)[anchor] {
					t.Errorf("%s:%d: %s: no section #%s there", rel, i+1, target, anchor)
				}
			}
		}
	}
	if checked < 50 {
		t.Errorf("only %d relative links checked: is %s the repo?", checked, root)
	}
}
