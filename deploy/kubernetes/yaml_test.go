package kubernetes_test

import (
	"errors"
	"io"
	"strings"

	"go.yaml.in/yaml/v3"
)

// parseYAML returns the documents of a multi-document YAML file as generic
// values (maps are map[string]any).
func parseYAML(src string) ([]any, error) {
	dec := yaml.NewDecoder(strings.NewReader(src))
	dec.KnownFields(true)
	var docs []any
	for {
		var doc any
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			return docs, nil
		}
		if err != nil {
			return nil, err
		}
		if doc != nil {
			docs = append(docs, doc)
		}
	}
}
