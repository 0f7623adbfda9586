package config

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"github.com/caarlos0/env/v11"
)

// problem is one line of an *Error, with the position of its variable in
// the configuration table (README.md#configuration) so that the lines come
// out in that order.
type problem struct {
	// group comes first in the order: 0 for the plain variables, 1 for
	// COURIER_SUBSCRIPTIONS and the COURIER_SUB_ variables' names, then one
	// per subscription.
	group int
	order int
	name  string // the variable it is about, "" if none
	text  string
	// cross marks a problem of a variable the process has once that
	// depends on a subscription's values (reply subjects overlapping its
	// filter subjects): found while checking the subscription.
	cross bool
}

// scope is what a checker checks.
type scope int

const (
	// scopeAll checks every variable: there is no COURIER_SUBSCRIPTIONS.
	scopeAll scope = iota
	// scopeProcess checks what the process has once; the variables of one
	// message's path are checked per subscription.
	scopeProcess
	// scopeSubscription checks the variables of one subscription's path,
	// and what the process has once only where it meets them.
	scopeSubscription
)

// checker collects the problems of one Load.
type checker struct {
	scope    scope
	sub      *subNames // in scopeSubscription: how its variables are named
	environ  map[string]string
	fields   map[string]string // Go field name → variable, to name env's ParseErrors
	defaults map[string]string // variable → envDefault, for variables that have one
	derived  map[string]string // variable → value Load filled in when it was unset
	order    map[string]int    // variable → position in the configuration table
	bad      map[string]bool   // variables that did not parse: not checked further
	problems []problem
	subs     []subResult // with COURIER_SUBSCRIPTIONS: what each one's check found
}

func newChecker(environ map[string]string) *checker {
	c := &checker{
		environ:  environ,
		fields:   map[string]string{},
		defaults: map[string]string{},
		derived:  map[string]string{},
		order:    map[string]int{},
		bad:      map[string]bool{},
	}
	t := reflect.TypeFor[Config]()
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("env"), ",")
		if name == "" {
			continue
		}
		c.fields[f.Name] = name
		if d, ok := f.Tag.Lookup("envDefault"); ok {
			c.defaults[name] = d
		}
	}
	for i, s := range specs() {
		c.order[s.name] = i
	}
	// Parsed by parseInflight, not by env: no tag says its default.
	c.defaults[inflightVar] = strconv.Itoa(defaultInflight)
	return c
}

// parseErrors turns env's AggregateError into problems, one per variable.
func (c *checker) parseErrors(err error) {
	if err == nil {
		return
	}
	errs := []error{err}
	var agg env.AggregateError
	if errors.As(err, &agg) {
		errs = agg.Errors
	}
	for _, e := range errs {
		var pe env.ParseError
		if errors.As(e, &pe) {
			if name, ok := c.fields[pe.Name]; ok {
				c.bad[name] = true
				c.add(name, "%s", pe.Err)
				continue
			}
		}
		// Only a bug in Config's tags gets here; report it all the same.
		c.problems = append(c.problems, problem{order: len(c.order), text: e.Error()})
	}
}

// shown is a variable's value as a problem quotes it: as set (secrets
// redacted), else the value it defaulted to.
func (c *checker) shown(name string) string {
	if v := c.environ[name]; v != "" {
		return strconv.Quote(redactVar(name, v))
	}
	if v, ok := c.derived[name]; ok {
		return strconv.Quote(v) + " (default)"
	}
	if v, ok := c.defaults[name]; ok {
		return strconv.Quote(v) + " (default)"
	}
	return `""`
}

// add records a problem with a variable's value: NAME="value": message.
// The variables format names are named as the subscription being checked
// names them (subNames.rename), its arguments are left as they are.
func (c *checker) add(name, format string, args ...any) {
	c.record(name, false, c.display(name)+"="+c.shown(name)+": "+fmt.Sprintf(c.rename(format), args...))
}

// cross is add for a problem of a variable the process has once that
// depends on a subscription's values.
func (c *checker) cross(name, format string, args ...any) {
	c.record(name, true, c.display(name)+"="+c.shown(name)+": "+fmt.Sprintf(c.rename(format), args...))
}

// note records a problem written out in full (with no value in it: the
// variables it names are renamed as add's format is).
func (c *checker) note(name, text string) {
	c.record(name, false, c.rename(text))
}

// record keeps a problem if it belongs to the checker's scope.
func (c *checker) record(name string, cross bool, text string) {
	perSub := name != "" && isPerSub(name)
	switch c.scope {
	case scopeProcess:
		if perSub || cross {
			return // checked per subscription
		}
	case scopeSubscription:
		if name != "" && !perSub && !cross {
			return // checked once, for the process
		}
	}
	order, ok := c.order[name]
	if !ok {
		order = len(c.order)
	}
	c.problems = append(c.problems, problem{order: order, name: name, text: text, cross: cross})
}

// display is how a problem names the variable name: as the subscription
// being checked names it, else as it is.
func (c *checker) display(name string) string {
	if c.sub == nil {
		return name
	}
	return c.sub.display(name)
}

// rename renames the variables named in text as display does.
func (c *checker) rename(text string) string {
	if c.sub == nil {
		return text
	}
	return c.sub.rename(text)
}

// ok reports whether a variable parsed, so that a value that did not is not
// also blamed for breaking a rule with the zero left in its place.
func (c *checker) ok(names ...string) bool {
	for _, n := range names {
		if c.bad[n] {
			return false
		}
	}
	return true
}

func (c *checker) sorted() []string {
	slices.SortStableFunc(c.problems, func(a, b problem) int {
		if a.group != b.group {
			return a.group - b.group
		}
		return a.order - b.order
	})
	out := make([]string, len(c.problems))
	for i, p := range c.problems {
		out[i] = p.text
	}
	return out
}
